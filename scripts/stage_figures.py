"""Figures for the pipeline stages (NOTES.md, "Pipeline stages ... Figures"): the safety scanner against a
naive regex-everywhere scan, the usage ledger's caller cost and sustained write rate, the store's chain
reads and puts. Run from the repo root: ``.venv/bin/python scripts/stage_figures.py``."""

import asyncio
import os
import random
import re
import tempfile
import time

from proto.server import safety as S
from proto.server.storage.ledger import LedgerRow, UsageLedger
from proto.server.storage.store import ResponseStore

rng = random.Random(1)
words = ["the", "model", "reads", "a", "token", "and", "the", "tokenizer", "writes", "code", "def", "return", "value", "=", "key", "secret", "for", "while", "you", "do", "print", "show"]
text = " ".join(rng.choice(words) for _ in range(20000)) + "\n" + "x = compute(a, b)\n" * 2000
def best(fn, n=10):
    return min((lambda t: (fn(), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(n))
sc = S.SafetyScanner()
t_new = best(lambda: sc.scan(text))
rules = (*S._SECRET_RULES, *S._INJECTION_RULES, S._GENERIC_RULE)
naive = [re.compile("|".join(f"(?:{r.regex.pattern})" for r in fam), flags)
         for fam, flags in ((S._SECRET_RULES, 0), (S._INJECTION_RULES, re.I), ((S._GENERIC_RULE,), re.I))]
t_old = best(lambda: [list(rx.finditer(text)) for rx in naive])
print(f"safety: {len(text)} chars  trigger+match {t_new*1e3:.2f} ms ({len(text)/t_new/1e6:.1f} Mchar/s)"
      f"  regex-search-everywhere {t_old*1e3:.2f} ms ({len(text)/t_old/1e6:.1f} Mchar/s)  x{t_old/t_new:.1f}")
clean = "Plain prose about the weather and a function that adds two numbers. " * 2000
t = best(lambda: sc.scan(clean))
print(f"safety: clean prose {len(clean)} chars {t*1e3:.2f} ms ({len(clean)/t/1e6:.1f} Mchar/s)")

d = tempfile.mkdtemp()
led = UsageLedger(os.path.join(d, "l.db"))
led.start()
N = 50_000
t0 = time.perf_counter()
for i in range(N):
    led.record(LedgerRow(f"resp_{i}", "key_a", "mock-1000tps", "ws", "completed", 100, 0, 10, 1, 0.0, 0.0))
t1 = time.perf_counter()
led.close()
t2 = time.perf_counter()
print(f"ledger: record() {(t1-t0)/N*1e6:.2f} us/row on the caller; {N} rows committed in {t2-t0:.2f} s "
      f"({N/(t2-t0):.0f} rows/s), retries {led.retries}, overflow {led.overflow}")

idle = UsageLedger(":memory:")
t0 = time.perf_counter()
for i in range(N):
    idle.record(LedgerRow(f"resp_{i}", "key_a", "mock-1000tps", "ws", "completed", 100, 0, 10, 1, 0.0, 0.0))
print(f"ledger: record() with the writer idle {(time.perf_counter()-t0)/N*1e6:.2f} us/row")
idle.close()

async def store_fig():
    st = ResponseStore(os.path.join(d, "s.db"))
    body = b'{"id":"x","output":[' + b'{"type":"message","content":"hello world"},' * 20 + b'{}]}'
    items = b'[' + b'{"type":"message","role":"user","content":"hi there"},' * 5 + b'{}]'
    t0 = time.perf_counter()
    for i in range(1000):
        await st.put(f"r{i}", "k", body, items, f"r{i-1}" if i else None, "m")
    t1 = time.perf_counter()
    for n in (1, 10, 100):
        r0, b0 = st.reads, st.bytes_read
        t = time.perf_counter()
        for _ in range(100):
            await st.chain(f"r{n-1}", "k")
        dt = (time.perf_counter() - t) / 100
        print(f"store: chain({n}) {dt*1e3:.3f} ms, {(st.reads-r0)//100} rows, {(st.bytes_read-b0)//100} bytes read")
    print(f"store: put {(t1-t0)/1000*1e6:.0f} us each ({len(body)+len(items)} bytes)")
    await st.aclose()
asyncio.run(store_fig())
