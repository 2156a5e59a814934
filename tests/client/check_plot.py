#!/usr/bin/env python3
"""Reads what `ddpctl plot` wrote, independently of ddp's own code, for the tests.

  check_plot.py svg FILE        parses FILE as XML (exit 1 if it is not) and prints
                                size|WIDTH|HEIGHT, then one line per stroked path:
                                  line|stroke|width|dashed (0 or 1)|x,y x,y ...
                                and one per run of glyphs (cairo draws text as glyph
                                outlines, each placed by a <use>):
                                  text|fill|glyphs|first x|last x|baseline y
                                colours as #rrggbb
  check_plot.py png FILE OUT    decodes FILE (any PNG filter, 8-bit RGB/RGBA), writes
                                its pixels to OUT as a binary PPM and prints WIDTH HEIGHT
"""
import re
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"


def style(el):
    """An element's presentation: its style="k:v;..." over its attributes."""
    out = dict(el.attrib)
    for item in el.get("style", "").split(";"):
        if ":" in item:
            k, v = item.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def colour(value):
    """#rrggbb of an SVG colour: #rrggbb, or rgb() in percent or 0-255."""
    value = value.strip()
    if value.startswith("#") and len(value) == 7:
        return value.lower()
    m = re.fullmatch(r"rgb\(([^,]+),([^,]+),([^)]+)\)", value)
    if not m:
        sys.exit("unknown colour %r" % value)
    rgb = []
    for v in m.groups():
        v = v.strip()
        rgb.append(round(float(v[:-1]) * 255 / 100) if v.endswith("%") else int(v))
    return "#%02x%02x%02x" % tuple(rgb)


def points(d):
    """The vertices of a path made of M and L commands (what a polyline becomes)."""
    tokens = re.findall(r"[A-Za-z]|-?[0-9.]+(?:e-?[0-9]+)?", d)
    out, i = [], 0
    while i < len(tokens):
        cmd = tokens[i]
        if cmd not in ("M", "L"):
            sys.exit("path command %r in a stroked line" % cmd)
        out.append((float(tokens[i + 1]), float(tokens[i + 2])))
        i += 3
    return out


def walk(el):
    """Every element below el, outside <defs> (the glyph outlines live there)."""
    for child in el:
        if child.tag == SVG + "defs":
            continue
        yield child
        yield from walk(child)


def svg(path):
    root = ET.parse(path).getroot()
    if root.tag != SVG + "svg":
        sys.exit("root element is %s, not svg" % root.tag)
    print("size|%s|%s" % (root.get("width", "").removesuffix("px"),
                          root.get("height", "").removesuffix("px")))
    for el in walk(root):
        st = style(el)
        if el.tag == SVG + "path" and st.get("stroke", "none") != "none":
            dashed = st.get("stroke-dasharray", "none") != "none"
            print("line|%s|%s|%d|%s" % (colour(st["stroke"]), st.get("stroke-width", "1"),
                                        dashed, " ".join("%g,%g" % p for p in points(st["d"]))))
        elif el.tag == SVG + "g":
            uses = [u for u in el if u.tag == SVG + "use"]
            if uses and all(u.get(XLINK + "href", "").startswith("#glyph") for u in uses):
                xs = [float(u.get("x")) for u in uses]
                ys = {float(u.get("y")) for u in uses}
                if len(ys) != 1:
                    sys.exit("a glyph run off its baseline: %s" % sorted(ys))
                print("text|%s|%d|%g|%g|%g" % (colour(st["fill"]), len(uses), xs[0], xs[-1],
                                               ys.pop()))


def png(path, out):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit("not a PNG signature")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            sys.exit("bad CRC in %r chunk" % kind)
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                sys.exit("unsupported PNG: depth %d type %d interlace %d" % (depth, ctype, interlace))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 255
            elif f != 0:
                sys.exit("bad filter %d" % f)
        rows.append(bytes(line))
        prev = line
    with open(out, "wb") as o:
        o.write(b"P6\n%d %d\n255\n" % (width, height))
        for r in rows:
            if bpp == 3:
                o.write(r)
            else:
                o.write(b"".join(r[k:k + 3] for k in range(0, len(r), 4)))
    print(width, height)


if __name__ == "__main__":
    if sys.argv[1] == "svg":
        svg(sys.argv[2])
    else:
        png(sys.argv[2], sys.argv[3])
