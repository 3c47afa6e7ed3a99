"""Generate ``proto/core/openai_types.py``: the Responses API's request schema as msgspec structs, taken
from the official ``openai`` Python SDK's generated request types (``openai/types/responses/*_param.py``,
themselves generated from OpenAI's OpenAPI spec).

    python scripts/gen_openai_types.py            # rewrite proto/core/openai_types.py
    python scripts/gen_openai_types.py --check    # exit 1 when the file differs from what the SDK gives

Roots: every field of ``ResponseCreateParamsBase`` (the body of ``POST /v1/responses``), which reaches the
input item union (``ResponseInputItemParam``), the tool union (``ToolParam``), ``tool_choice``, ``text``,
``reasoning``, ``prompt`` and the rest. Each ``TypedDict`` becomes a ``msgspec.Struct``; a ``type`` field
with one literal value becomes the struct's tag, so every union decodes in one call and an unknown ``type``
is named in the error. The rules, and where they bend (each bend says why):

* ``Required[...]`` fields have no default; the others default to ``None`` and are omitted when encoded, so
  a stored item re-encodes as it came in.
* A ``type`` with several literal values (``ComparisonFilter``: ``eq``, ``ne``, …; ``web_search`` and its
  dated alias) becomes a base struct and one tagged subclass per value.
* Union members that share a tag are merged into one struct (the input union's three ``message`` shapes:
  easy, input and output message): a field is required only when every member requires it.
* ``RELAXED``: fields the spec marks required that real clients omit and the API accepts.
* ``EXTENSIONS``: the lab's own documented extra fields (kept through a store round-trip).
* ``ECHOED``: parts the Response echoes with every field present, defaults filled in as OpenAI's API does.
* Every ``int`` is ``Int64`` (bounded to int64): the SDK's ``int`` is unbounded, the wire's is not.
"""

from __future__ import annotations

import argparse
import collections.abc
import keyword
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import openai
import typing_extensions as te
from openai.types.responses import response_create_params

OUT = Path(__file__).resolve().parent.parent / "proto" / "core" / "openai_types.py"

# (struct name, field) -> why the field is optional here although the spec requires it.
RELAXED: dict[tuple[str, str], str] = {
    (
        "ResponseOutputText",
        "annotations",
    ): "Codex and the AI SDK send output_text parts back without annotations",
    # The images guide: "detail ... defaults to auto"; Codex's view_image output and the AI SDK's file
    # parts send input_image without it.
    ("ResponseInputImage", "detail"): "the API defaults it to auto",
    # Required but nullable in the spec: a missing one reads as null (a function tool declared by name).
    ("FunctionTool", "parameters"): "nullable: absent means null",
    ("FunctionTool", "strict"): "nullable: absent means null",
    # opencode (the AI SDK's Responses provider) with store: false and include: [reasoning.encrypted_content]
    # sends its reasoning items back without an id; OpenAI accepts them (the id names a stored item, and
    # none is stored). The SDK's own message and function_call input types already make id optional.
    ("ResponseReasoningItem", "id"): "sent back without one under store: false; the API accepts it",
    # An output item sent back as input: its status is the server's own report (the SDK's message and
    # function_call input types make it optional; these call items are the same kind of echo).
    **{
        (name, "status"): "an output item's own report, optional when sent back as input"
        for name in (
            "ResponseFunctionWebSearch",
            "ResponseFileSearchToolCall",
            "ResponseComputerToolCall",
            "ImageGenerationCall",
            "ResponseCodeInterpreterToolCall",
            "LocalShellCall",
            "ApplyPatchCall",
        )
    },
}
# struct name -> extra fields (name, type source) the lab adds, documented in docs/protocol.md, "The create
# body, items and tools".
EXTENSIONS: dict[str, list[tuple[str, str]]] = {
    # The mock web search's results: the rendering reads them, so a client that sends the call back
    # (HTTP, store: false) gets the same context as one that continues on the server.
    "ActionSearchSource": [("title", "str | None"), ("snippet", "str | None")],
}
# struct name -> {field: default source}: a part the Response echoes with every field present (encoded
# without ``omit_defaults``), absent ones as the API fills them in. The Open Responses ``InputImageContent``
# requires ``image_url`` (null for an image given by ``file_id``) and ``detail``; OpenAI returns both, and
# ``detail`` defaults to "auto" (the images guide). Stored items re-encode the same way, so every echo
# (``input_items``, conversation items, ``/responses/compact``) carries them.
ECHOED: dict[str, dict[str, str]] = {"ResponseInputImage": {"detail": "'auto'"}}
# struct name -> (fields, why): one of these must be set (checked in ``__post_init__``, so msgspec refuses
# the part with its path on every decode: ``invalid_request``, docs/protocol.md, "Error codes").
ONE_OF: dict[str, tuple[tuple[str, ...], str]] = {
    "ResponseInputImage": (("image_url", "file_id"), "an input_image needs an image_url or a file_id"),
}
# Union members merged under one tag get these names (else ``Merged<Tag>``).
MERGED_NAMES = {"message": "Message"}


@dataclass
class StructDef:
    name: str
    doc: str
    fields: list[tuple[str, str, bool]]  # (wire name, type source, required)
    tag: str | None = None
    base: str | None = None  # a tagged subclass of a multi-tag base
    subclasses: list[str] = field(default_factory=list)


class Generator:
    def __init__(self) -> None:
        self.structs: dict[str, StructDef] = {}  # by name, in creation order
        self.by_type: dict[Any, str] = {}  # TypedDict -> struct name (or union alias of its subclasses)
        self.merged: dict[frozenset[tuple[Any, ...]], str] = {}
        self.by_shape: dict[tuple[Any, ...], str] = {}
        self.aliases: dict[str, str] = {}  # union alias name -> source

    # ------------------------------------------------------------------------------------ names
    def _name_for(self, td: Any) -> str:
        name = td.__name__
        for suffix in ("ParamParam", "Param"):
            if name.endswith(suffix) and len(name) > len(suffix):
                name = name[: -len(suffix)]
                break
        if name in self.structs or name in self.aliases:
            module = td.__module__.rsplit(".", 1)[-1]
            prefix = "".join(
                part.capitalize() for part in module.split("_") if part not in ("param", "params")
            )
            name = prefix + name
        while name in self.structs or name in self.aliases:
            name += "_"
        return name

    # ------------------------------------------------------------------------------------ types
    def type_source(self, tp: Any) -> str:
        return self._render(self._flatten(tp))

    def _flatten(self, tp: Any) -> list[Any]:
        """The members of a type as a flat list of leaf types (unions opened, Required/Optional removed)."""
        origin = get_origin(tp)
        if origin in (te.Required, te.NotRequired, typing.Required, typing.NotRequired, te.Annotated):
            return self._flatten(get_args(tp)[0])
        if origin is Union:
            return [leaf for arg in get_args(tp) for leaf in self._flatten(arg)]
        if tp is type(None):
            return [None]
        return [tp]

    def _render(self, leaves: list[Any]) -> str:
        parts: list[str] = []
        nullable = None in leaves
        leaves = [leaf for leaf in leaves if leaf is not None]
        lists = [leaf for leaf in leaves if _is_list(leaf)]
        literals = [v for leaf in leaves if get_origin(leaf) is Literal for v in get_args(leaf)]
        tds = [leaf for leaf in leaves if te.is_typeddict(leaf)]
        has_str = str in leaves
        for leaf in leaves:
            if leaf is str:
                parts.append("str")
            elif leaf is int:
                parts.append("Int64")  # the header's: an integer of the wire is an int64
            elif leaf in (float, bool):
                parts.append(leaf.__name__)
            elif leaf is object or leaf is Any:
                return "Any"
            elif get_origin(leaf) in (dict, typing.Dict, collections.abc.Mapping):  # noqa: UP006
                value = get_args(leaf)[1] if get_args(leaf) else Any
                parts.append(f"dict[str, {self.type_source(value)}]")
            elif leaf is dict:
                parts.append("dict[str, Any]")
        if literals and not (has_str and all(isinstance(v, str) for v in literals)):
            parts.append("Literal[" + ", ".join(repr(v) for v in dict.fromkeys(literals)) + "]")
        if lists:
            elements = [
                leaf for lst in lists for leaf in self._flatten(get_args(lst)[0] if get_args(lst) else Any)
            ]
            parts.append(f"list[{self._render(elements)}]")
        if tds:
            parts.append(self._union_of(tds))
        if nullable:
            parts.append("None")
        rest = [
            leaf
            for leaf in leaves
            if not (
                leaf in (str, int, float, bool, object, dict)
                or leaf is Any
                or _is_list(leaf)
                or get_origin(leaf) in (Literal, dict, typing.Dict, collections.abc.Mapping)  # noqa: UP006
                or te.is_typeddict(leaf)
            )
        ]
        if rest:
            raise TypeError(f"unsupported type(s) {rest}")
        return " | ".join(dict.fromkeys(parts))

    def _union_of(self, tds: list[Any]) -> str:
        """Struct names for these TypedDicts, members sharing a tag merged into one."""
        by_tag: dict[str | None, list[Any]] = {}
        for td in dict.fromkeys(tds):
            for tag in _tags(td) or [None]:
                by_tag.setdefault(tag, []).append(td)
        names: list[str] = []
        for tag, group in by_tag.items():
            if len(group) == 1 or tag is None:
                names.extend(self.struct_for(td, tag if len(_tags(td)) > 1 else None) for td in group)
            else:
                names.append(self.merged_struct(tag, group))
        return " | ".join(dict.fromkeys(names))

    # ------------------------------------------------------------------------------------ structs
    def struct_for(self, td: Any, only_tag: str | None = None) -> str:
        """The struct (or, for a multi-tag TypedDict, the subclass for ``only_tag``) that holds ``td``.
        The SDK repeats some TypedDicts in several modules (``response_input_param`` and
        ``response_input_item_param`` spell out the same items): structurally equal ones share a struct."""
        key = _structural_key(td)
        if td not in self.by_type and key in self.by_shape:
            self.by_type[td] = self.by_shape[key]
        if td not in self.by_type:
            self._define(td)
            self.by_shape[key] = self.by_type[td]
        name = self.by_type[td]
        if only_tag is not None:
            return f"{name}_{_ident(only_tag)}"
        return name

    def _define(self, td: Any) -> None:
        name = self._name_for(td)
        tags = _tags(td)
        definition = StructDef(name=name, doc=_doc(td), fields=[], tag=tags[0] if len(tags) == 1 else None)
        self.structs[name] = definition
        if len(tags) > 1:
            alias = name + "Any"
            self.by_type[td] = name
            self.aliases[alias] = ""  # reserved; filled below
            for tag in tags:
                sub = f"{name}_{_ident(tag)}"
                self.structs[sub] = StructDef(name=sub, doc="", fields=[], tag=tag, base=name)
                definition.subclasses.append(sub)
            self.aliases[alias] = " | ".join(definition.subclasses)
        else:
            self.by_type[td] = name
        definition.fields = self._fields([td], name)

    def merged_struct(self, tag: str, group: list[Any]) -> str:
        key = frozenset(_structural_key(td) for td in group)
        if key in self.merged:
            return self.merged[key]
        name = MERGED_NAMES.get(tag, "Merged" + _ident(tag).capitalize())
        self.merged[key] = name
        members = ", ".join(td.__name__ for td in group)
        definition = StructDef(
            name=name, doc=f"One struct for the union members tagged {tag!r}: {members}.", fields=[], tag=tag
        )
        self.structs[name] = definition
        for td in group:
            self.by_type.setdefault(td, name)
        definition.fields = self._fields(group, name)
        return name

    def _fields(self, group: list[Any], name: str) -> list[tuple[str, str, bool]]:
        hints = [te.get_type_hints(td, include_extras=True) for td in group]
        order: list[str] = list(dict.fromkeys(key for h in hints for key in h))
        fields: list[tuple[str, str, bool]] = []
        tagged = self.structs[name].tag is not None or bool(self.structs[name].subclasses)
        for key in order:
            if key == "type" and tagged:
                continue
            leaves = [leaf for h in hints if key in h for leaf in self._flatten(h[key])]
            required = all(key in h and _required(td, h[key]) for h, td in zip(hints, group, strict=True))
            if (name, key) in RELAXED:
                required = False
            source = self._render(leaves)
            fields.append((key, source, required))
        for extra, source in EXTENSIONS.get(name, []):
            fields.append((extra, source, False))
        return fields

    # ------------------------------------------------------------------------------------ output
    def merge_equal(self, roots: dict[str, str]) -> None:
        """Structs that render the same (the SDK's ``…Content`` twins of content parts, once ``RELAXED``
        has made them equal) become one: the first name met stays, references move to it."""
        while True:
            seen: dict[tuple[Any, ...], str] = {}
            renames: dict[str, str] = {}
            for name, d in self.structs.items():
                if d.base or d.subclasses:
                    continue
                key = (d.tag, _render_struct(StructDef(name="_", doc="", fields=d.fields, tag=d.tag)))
                if key in seen:
                    renames[name] = seen[key]
                else:
                    seen[key] = name
            if not renames:
                return
            for name in renames:
                del self.structs[name]
            rename = _renamer(renames)
            for d in self.structs.values():
                d.fields = [(wire, rename(src), req) for wire, src, req in d.fields]
            for table in (self.aliases, roots):
                for key, src in table.items():
                    table[key] = rename(src)

    def render(self, roots: dict[str, str]) -> str:
        out = [HEADER.format(version=openai.__version__)]
        for definition in self.structs.values():
            out.append(_render_struct(definition))
        for alias, source in self.aliases.items():
            out.append(f"{alias} = {source}\n")
        for alias, source in roots.items():
            out.append(f"{alias} = {source}\n")
        return "\n\n".join(out).rstrip() + "\n"


HEADER = '''"""The Responses API request schema as msgspec structs. GENERATED by scripts/gen_openai_types.py from the
``openai`` Python SDK {version} (``openai/types/responses``, generated from OpenAI's OpenAPI spec): do not
edit; regenerate. The generator's docstring says how TypedDicts map to structs and where the lab bends the
spec (RELAXED, EXTENSIONS).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

SDK_VERSION = "{version}"
# Every integer of a request is an int64: what a typed client reads back when it is echoed (a larger one is
# refused in OpenAI's words, ``integer_above_max_value``: proto/core/limits.py).
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
'''  # noqa: E501 (the generated file's text, kept as it is)


def _render_struct(d: StructDef) -> str:
    echoed = ECHOED.get(d.name)
    options = ["kw_only=True"] if echoed is not None else ["kw_only=True", "omit_defaults=True"]
    if d.tag is not None:
        options = [f"tag={d.tag!r}", 'tag_field="type"', *options]
    elif d.subclasses:
        options = ['tag_field="type"', *options]
    base = d.base or "msgspec.Struct"
    lines = [f"class {d.name}({base}, {', '.join(options)}):"]
    checks: list[str] = []  # the body of ``__post_init__``
    if d.doc:
        lines.append(f'    """{d.doc}"""')
    for wire, source, required in sorted(d.fields, key=lambda f: not f[2]):
        attr = wire + "_" if keyword.iskeyword(wire) else wire
        if required:
            default = f" = msgspec.field(name={wire!r})" if attr != wire else ""
        elif echoed is not None and wire in echoed:  # null reads as absent: the default
            default = f" = {echoed[wire]}"
            source += " | None"
            checks.append(f"        if self.{attr} is None:\n            self.{attr} = {echoed[wire]}")
        else:
            if not source.endswith("None") and source != "Any":
                source += " | None"
            default = f" = msgspec.field(name={wire!r}, default=None)" if attr != wire else " = None"
        lines.append(f"    {attr}: {source}{default}")
    if d.name in ONE_OF:
        names, why = ONE_OF[d.name]
        either = " and ".join(f"self.{name} is None" for name in names)
        checks.append(f"        if {either}:\n            raise ValueError({why!r})")
    if checks:
        lines += ["", "    def __post_init__(self) -> None:", *checks]
    if len(lines) == 1 or (len(lines) == 2 and d.doc):
        lines.append("    pass")
    return "\n".join(lines) + "\n"


def _renamer(renames: dict[str, str]) -> typing.Callable[[str], str]:
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, renames)) + r")\b")
    return lambda source: _dedupe(pattern.sub(lambda m: renames[m[1]], source))


def _dedupe(source: str) -> str:
    """``A | B | A`` → ``A | B`` at every bracket depth (after a merge made two alternatives one)."""
    return _dedupe_at(source)


def _dedupe_at(source: str) -> str:
    alternatives = _split(source)
    unique: list[str] = []
    for alt in alternatives:
        head, bracket, inner = alt.partition("[")
        if bracket:
            alt = head + "[" + ", ".join(_dedupe_at(arg) for arg in _split(inner[:-1], ", ")) + "]"
        if alt not in unique:
            unique.append(alt)
    return " | ".join(unique)


def _split(source: str, sep: str = " | ") -> list[str]:
    """``source`` split on ``sep`` outside brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(source):
        ch = source[i]
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif depth == 0 and source.startswith(sep, i):
            parts.append(source[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(source[start:])
    return parts


def _structural_key(td: Any) -> tuple[Any, ...]:
    """What a TypedDict is on the wire, whatever the SDK calls it and its nested types (the SDK spells
    some shapes in several modules: ``response_input_param`` and ``response_input_item_param``,
    ``tool_param`` and the tool lists inside items)."""
    return _shape(td, ())


def _shape(tp: Any, seen: tuple[Any, ...]) -> Any:
    origin = get_origin(tp)
    if origin in (te.Required, te.NotRequired, typing.Required, typing.NotRequired, te.Annotated):
        return ("req" if origin in (te.Required, typing.Required) else "opt", _shape(get_args(tp)[0], seen))
    if te.is_typeddict(tp):
        if tp in seen:  # a recursive shape: name the cycle
            return ("cycle", seen.index(tp))
        hints = te.get_type_hints(tp, include_extras=True)
        return (
            "struct",
            bool(tp.__total__),
            tuple(sorted((key, _shape(hint, (*seen, tp))) for key, hint in hints.items())),
        )
    if origin is Union:
        return ("union", frozenset(_shape(arg, seen) for arg in get_args(tp)))
    if origin is Literal:
        return ("literal", frozenset(get_args(tp)))
    if _is_list(tp):
        return ("list", _shape(get_args(tp)[0], seen) if get_args(tp) else "any")
    if origin is not None:
        return (getattr(origin, "__name__", str(origin)), tuple(_shape(arg, seen) for arg in get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def _required(td: Any, hint: Any) -> bool:
    # ``__required_keys__`` is wrong under ``from __future__ import annotations`` (the SDK's modules):
    # read ``Required[...]`` / ``NotRequired[...]`` off the resolved hint instead.
    origin = get_origin(hint)
    if origin in (te.Required, typing.Required):
        return True
    if origin in (te.NotRequired, typing.NotRequired):
        return False
    return bool(td.__total__)


def _is_list(tp: Any) -> bool:
    origin = get_origin(tp)
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence, typing.List):  # noqa: UP006
        return True
    return (
        getattr(tp, "__name__", "") == "SequenceNotStr" or getattr(origin, "__name__", "") == "SequenceNotStr"
    )


def _tags(td: Any) -> list[str]:
    hint = te.get_type_hints(td).get("type")
    if hint is None:
        return []
    values = [v for leaf in _leaves(hint) if get_origin(leaf) is Literal for v in get_args(leaf)]
    return (
        [v for v in values if isinstance(v, str)]
        if all(get_origin(leaf) is Literal or leaf is type(None) for leaf in _leaves(hint))
        else []
    )


def _leaves(tp: Any) -> list[Any]:
    if get_origin(tp) is Union:
        return [leaf for arg in get_args(tp) for leaf in _leaves(arg)]
    return [tp]


def _ident(tag: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in tag)


def _doc(td: Any) -> str:
    text = " ".join((td.__doc__ or "").split())
    if not text or text.startswith(td.__name__ + "("):
        return ""
    return (text[:200] + "…" if len(text) > 200 else text).replace('"""', "'''").replace("\\", "\\\\")


def generate() -> str:
    from openai.types.responses.response_input_item_param import ResponseInputItemParam
    from openai.types.responses.tool_param import ToolParam

    gen = Generator()
    # Tools first: where the SDK spells one shape twice, the first name met is kept (``NamespaceTool``,
    # not the copy inside ``tool_search_output``).
    roots = {
        "Tool": gen.type_source(ToolParam),
        "InputItem": gen.type_source(ResponseInputItemParam),
        # The whole create body but ``input``, which proto.core.events.CreateBody keeps raw so that each item
        # decodes on its own (an error names its index); CreateBody also narrows the defaults.
        "CreateParams": gen.struct_for(response_create_params.ResponseCreateParamsBase),
    }
    body = gen.structs[roots["CreateParams"]]
    body.fields = [f for f in body.fields if f[0] != "input"]
    gen.merge_equal(roots)
    return gen.render(roots)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = generate()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(
                f"{OUT} is not what openai {openai.__version__} generates; run scripts/gen_openai_types.py",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text.splitlines())} lines) from openai {openai.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
