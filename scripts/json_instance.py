#!/usr/bin/env python3
"""Deterministic generator of one valid JSON instance per JSON Schema.

Used by the structured-output benchmarks: every engine is driven along the same
instance text, token by token. Standard library only.

    from json_instance import instance_text
    text = instance_text(schema)              # compact JSON text, or None
    text = instance_text(schema, rich=True)   # also fills optional properties

CLI:
    python3 scripts/json_instance.py tests/data/json_schemas/schemas.jsonl out.jsonl [--rich]
writes one line per schema: {"id": ..., "instance": <JSON text or null>}.

How a value is chosen
  * minimal mode (default): objects carry only their required properties (plus
    whatever minProperties / dependentRequired force), arrays have minItems
    elements, strings are the shortest that satisfy minLength / pattern /
    format, numbers are the value closest to 0 inside the bounds, booleans are
    false, enums and consts take their first fitting value;
  * rich mode: additionally every optional property is filled (depth- and
    size-limited) and arrays get at least one element, which gives longer,
    more realistic outputs; an object whose rich form does not validate falls
    back to its minimal form;
  * property order is the order of the schema's "properties", then any
    remaining required names, which is the order grammar engines emit;
  * text is json.dumps(separators=(",", ":"), ensure_ascii=False).

Every candidate is checked by a small built-in validator (type, enum/const,
$ref, allOf/anyOf/oneOf/not, if/then/else, object, array, string and number
keywords; "format" is not checked, generated formats are fixed valid samples).
A schema whose instance cannot be produced or does not validate gets None.
Only local "#..." references (JSON pointers) are supported; regex patterns are
run with Python's re after a light ECMA-262 -> Python rewrite.
"""
import argparse
import json
import math
import re
import sys

try:  # Python >= 3.11
    import re._parser as _sre_parse
    import re._constants as _sre_c
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parse
    import sre_constants as _sre_c


class Unsupported(Exception):
    """The generator cannot produce (or check) a value for this schema."""


MAX_DEPTH = 48          # recursion guard (refs, nesting)
RICH_MAX_DEPTH = 4      # rich mode fills optional properties only this deep
RICH_MAX_NODES = 150    # and at most this many values per instance

FORMAT_SAMPLES = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "12:00:00Z",
    "duration": "P1D",
    "email": "user@example.com",
    "idn-email": "user@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "iri": "https://example.com/",
    "iri-reference": "https://example.com/",
    "uri-template": "https://example.com/{id}",
    "url": "https://example.com/",
    "uuid": "123e4567-e89b-42d3-a456-426614174000",
    "json-pointer": "/a",
    "relative-json-pointer": "0",
    "regex": "a",
    "byte": "AAAA",
}

TYPE_ORDER = ("object", "array", "string", "integer", "number", "boolean", "null")


# ----------------------------------------------------------------------------
# regular expressions

_re_cache = {}


def to_py_regex(pattern):
    """Compile an ECMA-262 style pattern with Python's re (light rewrite)."""
    hit = _re_cache.get(pattern)
    if hit is not None:
        if isinstance(hit, Unsupported):
            raise hit
        return hit
    p = re.sub(r"\(\?<(?![=!])", "(?P<", pattern)   # named groups
    try:
        p = _rewrite_unicode_props(p)
        rx = re.compile(p)
    except (re.error, OverflowError, RecursionError) as e:
        err = Unsupported(f"pattern {pattern!r}: {e}")
        _re_cache[pattern] = err
        raise err
    _re_cache[pattern] = rx
    return rx


# \p{..} classes, exact on ASCII and rough beyond it (instances are ASCII).
_UPROP = {
    "L": "a-zA-Z\u00c0-\u024f\u0370-\u03ff\u0400-\u04ff\u4e00-\u9fff",
    "Lu": "A-Z", "Ll": "a-z",
    "N": "0-9", "Nd": "0-9",
    "P": "!-#%-*,-/:;?@\\[-\\]_{}",
    "S": "$+<->^`|~",
    "Z": " \u00a0", "Zs": " \u00a0",
    "M": "\u0300-\u036f",
}


def _rewrite_unicode_props(p):
    """Replace \\p{X} by an explicit class; \\P{X} only outside classes."""
    if "\\p{" not in p and "\\P{" not in p:
        return p
    out, i, in_class = [], 0, False
    while i < len(p):
        ch = p[i]
        if ch == "\\" and i + 1 < len(p):
            m = re.match(r"\\([pP])\{([A-Za-z_]+)\}", p[i:])
            if m:
                name = m.group(2).split("=")[-1]
                if name not in _UPROP:
                    raise re.error(f"unicode property {name}")
                body = _UPROP[name]
                if m.group(1) == "P":
                    if in_class:
                        raise re.error("negated property inside a class")
                    out.append("[^" + body + "]")
                else:
                    out.append(body if in_class else "[" + body + "]")
                i += m.end()
                continue
            out.append(p[i:i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


_CAT_CHAR = {
    _sre_c.CATEGORY_DIGIT: "0", _sre_c.CATEGORY_NOT_DIGIT: "a",
    _sre_c.CATEGORY_WORD: "a", _sre_c.CATEGORY_NOT_WORD: "-",
    _sre_c.CATEGORY_SPACE: " ", _sre_c.CATEGORY_NOT_SPACE: "a",
}
_CAT_TEST = {
    _sre_c.CATEGORY_DIGIT: lambda c: c.isdigit(),
    _sre_c.CATEGORY_NOT_DIGIT: lambda c: not c.isdigit(),
    _sre_c.CATEGORY_WORD: lambda c: c.isalnum() or c == "_",
    _sre_c.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
    _sre_c.CATEGORY_SPACE: lambda c: c.isspace(),
    _sre_c.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
}
_CLASS_PROBES = "a0A-_ .b1Bz9Z/:@x"


def _in_class(c, items):
    neg = False
    hit = False
    for op, av in items:
        if op is _sre_c.NEGATE:
            neg = True
        elif op is _sre_c.LITERAL:
            hit = hit or ord(c) == av
        elif op is _sre_c.RANGE:
            hit = hit or av[0] <= ord(c) <= av[1]
        elif op is _sre_c.CATEGORY:
            hit = hit or _CAT_TEST.get(av, lambda _c: False)(c)
    return hit != neg


class _RegexGen:
    """Builds one string from a parsed pattern: shortest repeats, `extra`
    additional repeats for open-ended quantifiers, `seed` rotates choices."""

    def __init__(self, seed, extra):
        self.seed, self.extra, self.groups, self.branch_no = seed, extra, {}, 0

    def run(self, seq):
        out = []
        for op, av in seq:
            out.append(self.node(op, av))
        return "".join(out)

    def node(self, op, av):
        c = _sre_c
        if op is c.LITERAL:
            return chr(av)
        if op is c.NOT_LITERAL:
            return "a" if av != ord("a") else "b"
        if op is c.ANY:
            return "a"
        if op is c.IN:
            neg = any(o is c.NEGATE for o, _ in av)
            if not neg:
                choices = [(o, v) for o, v in av if o is not c.NEGATE]
                o, v = choices[self.seed % len(choices)] if self.seed else choices[0]
                if o is c.LITERAL:
                    return chr(v)
                if o is c.RANGE:
                    return chr(v[0])
                if o is c.CATEGORY and v in _CAT_CHAR:
                    return _CAT_CHAR[v]
            for ch in _CLASS_PROBES:
                if _in_class(ch, av):
                    return ch
            raise Unsupported("character class")
        if op is c.CATEGORY:
            if av in _CAT_CHAR:
                return _CAT_CHAR[av]
            raise Unsupported("category")
        if op in (c.MAX_REPEAT, c.MIN_REPEAT) or op is getattr(c, "POSSESSIVE_REPEAT", None):
            lo, hi, sub = av
            n = lo
            if hi is c.MAXREPEAT or hi > lo:
                n = lo + self.extra
                if hi is not c.MAXREPEAT:
                    n = min(n, hi)
            return "".join(self.run(sub) for _ in range(n))
        if op is c.SUBPATTERN:
            gid, sub = av[0], av[-1]
            s = self.run(sub)
            if gid is not None:
                self.groups[gid] = s
            return s
        if op is c.BRANCH:
            alts = av[1]
            k = (self.seed + self.branch_no) % len(alts) if self.seed else 0
            self.branch_no += 1
            return self.run(alts[k])
        if op is c.AT or op is c.ASSERT or op is c.ASSERT_NOT:
            return ""
        if op is c.GROUPREF:
            return self.groups.get(av, "")
        if op is getattr(c, "ATOMIC_GROUP", None):
            return self.run(av)
        raise Unsupported(f"regex op {op}")


def strings_for_pattern(pattern):
    """Candidate strings for a pattern, shortest first (all checked by re)."""
    rx = to_py_regex(pattern)
    try:
        tree = _sre_parse.parse(rx.pattern)
    except Exception as e:  # noqa: BLE001 - anything the parser throws
        raise Unsupported(f"pattern parse: {e}")
    seen = set()
    for extra in (0, 1, 2, 3, 5, 8, 16, 32, 64):
        for seed in range(4):
            try:
                s = _RegexGen(seed, extra).run(tree)
            except (Unsupported, RecursionError):
                continue
            if s not in seen and rx.search(s):
                seen.add(s)
                yield s


# ----------------------------------------------------------------------------
# schema helpers

def _types(s):
    t = s.get("type")
    if t is None:
        return None
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    return None


def _json_type_ok(t, v):
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or (
            isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    if t == "object":
        return isinstance(v, dict)
    return True  # unknown type names (e.g. draft-3 "any")


def _json_eq(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _bounds(s):
    """(lo, lo_excl, hi, hi_excl) over draft-4 and draft-6+ spellings."""
    lo = s.get("minimum")
    hi = s.get("maximum")
    lo_x = hi_x = False
    em, eM = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if isinstance(em, bool):
        lo_x = em and lo is not None
    elif isinstance(em, (int, float)):
        if lo is None or em >= lo:
            lo, lo_x = em, True
    if isinstance(eM, bool):
        hi_x = eM and hi is not None
    elif isinstance(eM, (int, float)):
        if hi is None or eM <= hi:
            hi, hi_x = eM, True
    if not isinstance(lo, (int, float)) or isinstance(lo, bool):
        lo, lo_x = None, False
    if not isinstance(hi, (int, float)) or isinstance(hi, bool):
        hi, hi_x = None, False
    return lo, lo_x, hi, hi_x


def _is_multiple(v, m):
    if not isinstance(m, (int, float)) or m <= 0:
        return True
    if isinstance(v, int) and isinstance(m, int):
        return v % m == 0
    q = v / m
    return abs(q - round(q)) < 1e-9


class Generator:
    def __init__(self, root, rich=False):
        self.root = root
        self.rich = rich
        self.nodes = 0

    # ---------------------------------------------------------------- refs
    def resolve(self, ref):
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unsupported(f"non-local $ref {ref!r}")
        frag = ref[1:]
        if frag and not frag.startswith("/"):
            raise Unsupported(f"anchor $ref {ref!r}")
        node = self.root
        for part in frag.split("/")[1:]:
            part = _unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise Unsupported(f"unresolvable $ref {ref!r}")
        return node

    # ------------------------------------------------------------ validate
    def valid(self, s, v, depth=0):
        if depth > MAX_DEPTH:
            raise Unsupported("validation too deep")
        if s is True or s == {}:
            return True
        if s is False:
            return False
        if not isinstance(s, dict):
            return True
        d = depth + 1
        if "$ref" in s:
            if not self.valid(self.resolve(s["$ref"]), v, d):
                return False
        ts = _types(s)
        if ts is not None and not any(_json_type_ok(t, v) for t in ts):
            return False
        if "enum" in s and isinstance(s["enum"], list):
            if not any(_json_eq(v, e) for e in s["enum"]):
                return False
        if "const" in s and not _json_eq(v, s["const"]):
            return False
        for sub in s.get("allOf", []) or []:
            if not self.valid(sub, v, d):
                return False
        if isinstance(s.get("anyOf"), list) and not any(self.valid(x, v, d) for x in s["anyOf"]):
            return False
        if isinstance(s.get("oneOf"), list) and sum(
                1 for x in s["oneOf"] if self.valid(x, v, d)) != 1:
            return False
        if "not" in s and self.valid(s["not"], v, d):
            return False
        if "if" in s:
            branch = s.get("then") if self.valid(s["if"], v, d) else s.get("else")
            if branch is not None and not self.valid(branch, v, d):
                return False
        if isinstance(v, dict):
            return self._valid_object(s, v, d)
        if isinstance(v, list):
            return self._valid_array(s, v, d)
        if isinstance(v, str):
            return self._valid_string(s, v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return self._valid_number(s, v)
        return True

    def _valid_object(self, s, v, d):
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        pats = s.get("patternProperties") if isinstance(s.get("patternProperties"), dict) else {}
        req = s.get("required")
        if isinstance(req, list) and any(k not in v for k in req):
            return False
        if "minProperties" in s and len(v) < s["minProperties"]:
            return False
        if "maxProperties" in s and len(v) > s["maxProperties"]:
            return False
        dep_req = dict(s.get("dependentRequired") or {})
        dep_sch = dict(s.get("dependentSchemas") or {})
        for k, dv in (s.get("dependencies") or {}).items():
            (dep_req if isinstance(dv, list) else dep_sch)[k] = dv
        for k, names in dep_req.items():
            if k in v and any(n not in v for n in names):
                return False
        for k, sub in dep_sch.items():
            if k in v and not self.valid(sub, v, d):
                return False
        add = s.get("additionalProperties", True)
        pn = s.get("propertyNames")
        for k, x in v.items():
            if pn is not None and not self.valid(pn, k, d):
                return False
            matched = False
            if k in props:
                matched = True
                if not self.valid(props[k], x, d):
                    return False
            for p, sub in pats.items():
                if to_py_regex(p).search(k):
                    matched = True
                    if not self.valid(sub, x, d):
                        return False
            if not matched and not self.valid(add, x, d):
                return False
        return True

    def _valid_array(self, s, v, d):
        if "minItems" in s and len(v) < s["minItems"]:
            return False
        if "maxItems" in s and len(v) > s["maxItems"]:
            return False
        prefix = s.get("prefixItems")
        items = s.get("items")
        rest = s.get("additionalItems", True)
        if isinstance(items, list):        # draft 4-2019 tuple form
            prefix, items = items, rest
        prefix = prefix if isinstance(prefix, list) else []
        for i, x in enumerate(v):
            sub = prefix[i] if i < len(prefix) else items
            if sub is not None and not self.valid(sub, x, d):
                return False
        if s.get("uniqueItems") is True:
            for i in range(len(v)):
                for j in range(i):
                    if _json_eq(v[i], v[j]):
                        return False
        if "contains" in s:
            n = sum(1 for x in v if self.valid(s["contains"], x, d))
            if n < s.get("minContains", 1):
                return False
            if "maxContains" in s and n > s["maxContains"]:
                return False
        return True

    def _valid_string(self, s, v):
        n = len(v)  # code points, as JSON Schema counts
        if "minLength" in s and n < s["minLength"]:
            return False
        if "maxLength" in s and n > s["maxLength"]:
            return False
        if isinstance(s.get("pattern"), str) and not to_py_regex(s["pattern"]).search(v):
            return False
        return True

    def _valid_number(self, s, v):
        lo, lo_x, hi, hi_x = _bounds(s)
        if lo is not None and (v < lo or (lo_x and v == lo)):
            return False
        if hi is not None and (v > hi or (hi_x and v == hi)):
            return False
        return _is_multiple(v, s.get("multipleOf"))

    # ------------------------------------------------------------ generate
    def flatten(self, s, depth):
        """Merge $ref and allOf into one dict schema (for generation only;
        the original is still used for validation)."""
        if depth > MAX_DEPTH:
            raise Unsupported("too deep")
        if s is True:
            return {}
        if s is False:
            raise Unsupported("false schema")
        if not isinstance(s, dict):
            return {}
        out = {k: v for k, v in s.items() if k not in ("$ref", "allOf")}
        parts = []
        if "$ref" in s:
            parts.append(self.flatten(self.resolve(s["$ref"]), depth + 1))
        for sub in s.get("allOf") or []:
            parts.append(self.flatten(sub, depth + 1))
        for p in parts:
            out = _merge(out, p)
        return out

    def gen(self, s, depth=0, variant=0, rich=None):
        """A value valid against s, or raise Unsupported."""
        if rich is None:
            rich = self.rich
        if depth > MAX_DEPTH:
            raise Unsupported("too deep")
        self.nodes += 1
        if rich and (depth > RICH_MAX_DEPTH or self.nodes > RICH_MAX_NODES):
            rich = False
        f = self.flatten(s, depth)
        for cand in self._candidates(f, depth, variant, rich):
            if self.valid(s, cand, depth):
                return cand
        if rich:
            return self.gen(s, depth, variant, rich=False)
        raise Unsupported("no valid candidate")

    def _candidates(self, f, depth, variant, rich):
        if "const" in f:
            yield f["const"]
            return
        if isinstance(f.get("enum"), list) and f["enum"]:
            e = f["enum"]
            for i in range(len(e)):
                yield e[(variant + i) % len(e)]
            return
        # combinators: pick a branch, generate from base + branch
        base = {k: v for k, v in f.items() if k not in ("anyOf", "oneOf", "if", "then", "else", "not")}
        if isinstance(f.get("anyOf"), list) or isinstance(f.get("oneOf"), list):
            branches = f.get("anyOf") if isinstance(f.get("anyOf"), list) else f["oneOf"]
            for b in branches:
                try:
                    merged = _merge(base, self.flatten(b, depth + 1))
                    if "if" in f:
                        merged = dict(merged, **{k: f[k] for k in ("if", "then", "else") if k in f})
                    yield from self._candidates(merged, depth + 1, variant, rich)
                except Unsupported:
                    continue
            if isinstance(f.get("anyOf"), list) and isinstance(f.get("oneOf"), list):
                # both present: the loop above only used anyOf; try oneOf too
                for b in f["oneOf"]:
                    try:
                        yield from self._candidates(_merge(base, self.flatten(b, depth + 1)),
                                                    depth + 1, variant, rich)
                    except Unsupported:
                        continue
            return
        if "if" in f:
            plain = list(self._typed(base, depth, variant, rich))
            for v in plain:
                try:
                    cond = self.valid(f["if"], v, depth)
                except Unsupported:
                    continue
                branch = f.get("then") if cond else f.get("else")
                if branch is None:
                    yield v
                    continue
                try:
                    yield from self._typed(_merge(base, self.flatten(branch, depth + 1)),
                                           depth, variant, rich)
                except Unsupported:
                    continue
            return
        yield from self._typed(base, depth, variant, rich)

    def _typed(self, f, depth, variant, rich):
        if "const" in f or "enum" in f:
            yield from self._candidates(f, depth, variant, rich)
            return
        ts = _types(f)
        if ts is None:
            ts = _infer_types(f)
        ts = sorted(ts, key=lambda t: (t == "null", TYPE_ORDER.index(t) if t in TYPE_ORDER else 99))
        if not ts:
            raise Unsupported("empty type list")
        for t in ts:
            try:
                if t == "object":
                    yield self._object(f, depth, variant, rich)
                elif t == "array":
                    yield self._array(f, depth, variant, rich)
                elif t == "string":
                    yield from self._strings(f, variant, rich)
                elif t in ("integer", "number"):
                    yield self._number(f, t == "integer", variant)
                elif t == "boolean":
                    yield bool(variant % 2)
                elif t == "null":
                    yield None
            except Unsupported:
                continue

    def _object(self, f, depth, variant, rich):
        props = f.get("properties") if isinstance(f.get("properties"), dict) else {}
        pats = f.get("patternProperties") if isinstance(f.get("patternProperties"), dict) else {}
        add = f.get("additionalProperties", True)
        req = [k for k in (f.get("required") if isinstance(f.get("required"), list) else [])
               if isinstance(k, str)]
        dep_req = dict(f.get("dependentRequired") or {})
        for k, dv in (f.get("dependencies") or {}).items():
            if isinstance(dv, list):
                dep_req[k] = dv
        want = list(dict.fromkeys(req))
        optional = [k for k in props if k not in want]
        max_props = f.get("maxProperties")
        if rich:
            want += optional
        need = f.get("minProperties", 0)
        if isinstance(need, int):
            for k in optional:
                if len(want) >= need:
                    break
                if k not in want:
                    want.append(k)
            extra_i = 0
            while len(want) < need and extra_i < need + 8:
                k = self._extra_key(f, extra_i)
                extra_i += 1
                if k is not None and k not in want:
                    want.append(k)
        changed = True
        while changed:
            changed = False
            for k in list(want):
                for n in dep_req.get(k, []) or []:
                    if n not in want:
                        want.append(n)
                        changed = True
        order = {k: i for i, k in enumerate(props)}
        pos = {k: i for i, k in enumerate(want)}
        want.sort(key=lambda k: (order.get(k, len(order)), pos[k]))
        if isinstance(max_props, int) and len(want) > max_props:
            if rich:
                raise Unsupported("maxProperties (rich)")
            raise Unsupported("maxProperties")
        required = set(req)
        out = {}
        for k in want:
            subs = []
            if k in props:
                subs.append(props[k])
            for p, sub in pats.items():
                if to_py_regex(p).search(k):
                    subs.append(sub)
            if not subs:
                if add is False:
                    if k in required:
                        raise Unsupported(f"required {k!r} not allowed")
                    continue
                subs.append(add if isinstance(add, dict) else {})
            sub = subs[0] if len(subs) == 1 else {"allOf": subs}
            try:
                out[k] = self.gen(sub, depth + 1, variant, rich)
            except Unsupported:
                if k in required or not rich:
                    raise
        return out

    def _extra_key(self, f, i):
        pn = f.get("propertyNames")
        pats = f.get("patternProperties") if isinstance(f.get("patternProperties"), dict) else {}
        cands = []
        for p in pats:
            try:
                cands += list(strings_for_pattern(p))[:4]
            except Unsupported:
                pass
        cands += [f"key{j}" for j in range(i + 8)]
        seen = 0
        for c in cands:
            if c in (f.get("properties") or {}):
                continue
            if pn is not None:
                try:
                    if not self.valid(pn, c):
                        continue
                except Unsupported:
                    continue
            if seen == i:
                return c
            seen += 1
        return None

    def _array(self, f, depth, variant, rich):
        prefix = f.get("prefixItems")
        items = f.get("items")
        rest = f.get("additionalItems", True)
        if isinstance(items, list):
            prefix, items = items, rest
        prefix = prefix if isinstance(prefix, list) else []
        if items is None:
            items = {}
        n = f.get("minItems", 0) if isinstance(f.get("minItems"), int) else 0
        if rich:
            n = max(n, 1, min(len(prefix), 4))
        mx = f.get("maxItems")
        if isinstance(mx, int):
            n = min(n, mx)
        contains = f.get("contains")
        n_cont = 0
        if contains is not None:
            n_cont = f.get("minContains", 1)
            n = max(n, n_cont)
        unique = f.get("uniqueItems") is True
        out = []
        for i in range(n):
            if i < len(prefix):
                sub = prefix[i]
            elif items is False:
                raise Unsupported("items false")
            else:
                sub = items
            if i < n_cont:
                sub = {"allOf": [sub, contains]}
            tries = 12 if unique else 1
            for t in range(tries):
                v = self.gen(sub, depth + 1, variant + i + t, rich)
                if not unique or not any(_json_eq(v, w) for w in out):
                    break
            else:
                raise Unsupported("uniqueItems")
            out.append(v)
        return out

    def _strings(self, f, variant, rich):
        lo = f.get("minLength", 0) if isinstance(f.get("minLength"), int) else 0
        hi = f.get("maxLength") if isinstance(f.get("maxLength"), int) else None
        fmt = f.get("format")
        pattern = f.get("pattern") if isinstance(f.get("pattern"), str) else None
        suffix = str(variant) if variant else ""

        def fit(s):
            if len(s) < lo:
                s = s + "a" * (lo - len(s))
            return s

        if isinstance(fmt, str) and fmt in FORMAT_SAMPLES:
            yield FORMAT_SAMPLES[fmt]
        if pattern is not None:
            count = 0
            for s in strings_for_pattern(pattern):
                if len(s) >= lo and (hi is None or len(s) <= hi):
                    yield s
                    count += 1
                    if count >= 6:
                        return
            return
        base = ("example" if rich else "") + suffix
        s = fit(base)
        if hi is not None and len(s) > hi:
            s = s[:hi] if len(s[:hi]) >= lo else s
        yield s

    def _number(self, f, integer, variant):
        lo, lo_x, hi, hi_x = _bounds(f)
        m = f.get("multipleOf")
        if not isinstance(m, (int, float)) or isinstance(m, bool) or m <= 0:
            m = None
        step = m if m is not None else 1
        if integer and m is not None and not float(m).is_integer():
            step = 1  # rare; validation will decide

        def ok(v):
            if lo is not None and (v < lo or (lo_x and v == lo)):
                return False
            if hi is not None and (v > hi or (hi_x and v == hi)):
                return False
            return m is None or _is_multiple(v, m)

        if ok(0) and variant == 0:
            return 0
        # start at the nearest multiple of step inside the bounds
        if lo is not None and lo > 0 or (lo is not None and hi is not None and hi < 0):
            k = math.ceil(lo / step)
            v = k * step
            if lo_x and v == lo:
                v += step
        elif hi is not None and hi < 0:
            k = math.floor(hi / step)
            v = k * step
            if hi_x and v == hi:
                v -= step
        else:
            v = 0
        v = v + variant * step
        if isinstance(v, float) and v.is_integer() and (integer or abs(v) < 1e15):
            v = int(v)
        if integer and isinstance(v, float):
            raise Unsupported("integer bounds")
        if not ok(v):
            raise Unsupported("number bounds")
        return v


def _unquote(s):
    if "%" not in s:
        return s
    from urllib.parse import unquote
    return unquote(s)


def _infer_types(f):
    if any(k in f for k in ("properties", "required", "additionalProperties",
                            "patternProperties", "minProperties", "propertyNames")):
        return ["object"]
    if any(k in f for k in ("items", "prefixItems", "minItems", "maxItems", "contains")):
        return ["array"]
    if any(k in f for k in ("minLength", "maxLength", "pattern", "format")):
        return ["string"]
    if any(k in f for k in ("minimum", "maximum", "exclusiveMinimum",
                            "exclusiveMaximum", "multipleOf")):
        return ["number"]
    return ["null"]


def _merge(a, b):
    """Conjunction of two flattened schemas, good enough to guide generation."""
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = v
            continue
        cur = out[k]
        if k == "properties" and isinstance(cur, dict) and isinstance(v, dict):
            p = dict(cur)
            for pk, pv in v.items():
                p[pk] = pv if pk not in p else {"allOf": [p[pk], pv]}
            out[k] = p
        elif k == "required" and isinstance(cur, list) and isinstance(v, list):
            out[k] = list(dict.fromkeys(cur + v))
        elif k == "type":
            ta = [cur] if isinstance(cur, str) else list(cur)
            tb = [v] if isinstance(v, str) else list(v)
            both = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
            both += [t for t in tb if t == "integer" and "number" in ta and t not in both]
            if not both:
                raise Unsupported("type conflict")
            out[k] = both
        elif k == "enum" and isinstance(cur, list) and isinstance(v, list):
            out[k] = [x for x in cur if any(_json_eq(x, y) for y in v)]
            if not out[k]:
                raise Unsupported("enum conflict")
        elif k in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum") and \
                isinstance(cur, (int, float)) and isinstance(v, (int, float)) and \
                not isinstance(cur, bool) and not isinstance(v, bool):
            out[k] = max(cur, v)
        elif k in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum") and \
                isinstance(cur, (int, float)) and isinstance(v, (int, float)) and \
                not isinstance(cur, bool) and not isinstance(v, bool):
            out[k] = min(cur, v)
        elif k in ("items", "additionalProperties", "contains", "propertyNames") and \
                isinstance(cur, dict) and isinstance(v, dict):
            out[k] = {"allOf": [cur, v]}
        elif k == "additionalProperties" and (cur is False or v is False):
            out[k] = False
        elif k in ("anyOf", "oneOf"):
            # keep one here; the other becomes a nested conjunction
            out.setdefault("allOf", [])
            out["allOf"] = list(out["allOf"]) + [{k: v}]
        elif k in ("not", "if", "then", "else", "const", "pattern", "patternProperties"):
            out.setdefault("allOf", [])
            out["allOf"] = list(out["allOf"]) + [{k: v}]
        # other keywords: keep the first (annotations, etc.)
    if "allOf" in out:
        # nested conjunctions left for the validator; generation still tries
        extra = out.pop("allOf")
        for sub in extra:
            for k2, v2 in sub.items():
                if k2 not in out:
                    out[k2] = v2
    return out


def instance_value(schema, rich=False):
    """Python value valid against schema; raises Unsupported."""
    g = Generator(schema, rich=rich)
    v = g.gen(schema)
    if not g.valid(schema, v):
        raise Unsupported("final validation failed")
    return v


def instance_text(schema, rich=False):
    """Compact JSON text of an instance of schema, or None."""
    try:
        v = instance_value(schema, rich=rich)
    except (Unsupported, RecursionError):
        return None
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def explain(schema, rich=False):
    """(text, reason): reason is None on success."""
    try:
        v = instance_value(schema, rich=rich)
    except Unsupported as e:
        return None, str(e)
    except RecursionError:
        return None, "recursion"
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False), None


def main():
    ap = argparse.ArgumentParser(description="one valid JSON instance per schema")
    ap.add_argument("schemas", help="schemas.jsonl ({'id', 'schema'} per line)")
    ap.add_argument("out", help="output jsonl ({'id', 'instance'} per line)")
    ap.add_argument("--rich", action="store_true", help="also fill optional properties")
    args = ap.parse_args()
    n = ok = 0
    with open(args.schemas, encoding="utf-8") as fi, open(args.out, "w", encoding="utf-8") as fo:
        for line in fi:
            if not line.strip():
                continue
            row = json.loads(line)
            text = instance_text(row["schema"], rich=args.rich)
            n += 1
            ok += text is not None
            fo.write(json.dumps({"id": row["id"], "instance": text}, ensure_ascii=False) + "\n")
    print(f"{ok}/{n} schemas have an instance -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
