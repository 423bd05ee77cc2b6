"""Reading qlinear.h: the text cffi's cdef takes, and its integer constants
(both bindings read the header the same way)."""

import re


def _cdef_source(text):
    """qlinear.h reduced to what cffi's cdef takes: no comments, no
    preprocessor lines except integer #defines, no extern "C" wrapper."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out, skip = [], []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            d = s[1:].strip()
            if d.startswith(("if", "ifdef", "ifndef")):
                skip.append("__cplusplus" in d)
            elif d.startswith("endif"):
                skip.pop()
            elif d.startswith("else"):
                skip[-1] = not skip[-1] and "__cplusplus" not in d
            elif d.startswith("define") and not any(skip):
                m = re.match(r"define\s+(QL_\w+)\s+(-?\d+)\s*$", d)
                if m:
                    out.append(f"#define {m.group(1)} {m.group(2)}")
            continue
        if not any(skip):
            out.append(line)
    return "\n".join(out)


def header_constants(src):
    """{name: value} of the integer constants in cdef text (what _cdef_source
    gives): every #define QL_NAME <integer>, and every enum's values (an
    implicit one is the previous plus one, as in C). ValueError for a value
    that is neither an integer nor an earlier constant's name."""
    out = {}
    for m in re.finditer(r"^#define\s+(\w+)\s+(-?\d+)\s*$", src, re.M):
        out[m.group(1)] = int(m.group(2))
    for m in re.finditer(r"\benum\s*\w*\s*\{(.*?)\}", src, re.S):
        v = -1
        for item in m.group(1).split(","):
            name, eq, val = (part.strip() for part in item.partition("="))
            if not name:
                continue
            if not eq:
                v += 1
            elif val in out:
                v = out[val]
            else:
                try:
                    v = int(val, 0)
                except ValueError:
                    raise ValueError(f"{name} = {val}: not an integer") from None
            out[name] = v
    return out
