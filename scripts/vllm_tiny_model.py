"""A tiny random-weight Llama whose vocabulary covers the lab's token ids, built offline (nothing is
downloaded from a model hub). Runs in vLLM's own venv (``.venv-vllm``: transformers and torch are there):

    .venv-vllm/bin/python scripts/vllm_tiny_model.py DIR

The lab tokenizes with tiktoken's cl100k (ids up to 100 276, chat markers included), so the vocabulary is
100 352 (≥ 100 277, a multiple of 64). vLLM's CPU attention needs a head size ≥ 32: hidden 128 over 4 heads.
The tokenizer is a word-level one with a token per id ("t0" … "t100351"): vLLM needs one to detokenize,
and the API tier never reads its text (it counts ``token_ids``). The weights are random: what is measured
is the engine's scheduling, prefix cache and per-token cost, not what the model says.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 100_352
MAX_POSITIONS = 131_072  # the lab's longest histories (long-context workload) stay within it


def main(out: Path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="t0", bos_token="t1", eos_token="t2"
    )
    tokenizer.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters()):,} parameters, vocabulary {VOCAB:,}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
