#!/usr/bin/env python3
"""Reads what `ddpctl plot` wrote, independently of ddp's own code, for the tests.

  check_plot.py svg FILE        parses FILE as XML (exit 1 if it is not) and prints one
                                line per <polyline>: class|point count|stroke
  check_plot.py png FILE OUT    decodes FILE (any PNG filter, 8-bit RGB/RGBA), writes
                                its pixels to OUT as a binary PPM and prints WIDTH HEIGHT
"""
import struct
import sys
import xml.etree.ElementTree as ET
import zlib


def svg(path):
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    if root.tag != ns + "svg":
        sys.exit("root element is %s, not svg" % root.tag)
    for p in root.iter(ns + "polyline"):
        points = p.get("points", "").split()
        for xy in points:
            x, y = xy.split(",")
            float(x), float(y)
        print("%s|%d|%s" % (p.get("class", ""), len(points), p.get("stroke", "")))


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
