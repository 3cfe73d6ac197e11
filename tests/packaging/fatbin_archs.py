"""Lists the CUDA code a shared library carries, read from its .nv_fatbin section (the toolkit
here has no cuobjdump): one line per entry, `sass sm_90` for machine code (a `-real`
architecture) or `ptx compute_80` for PTX a newer GPU compiles at load time (`-virtual`).
With --expect ARCHS (CMake's CUDA_ARCHITECTURES list, e.g. "80-real;80-virtual;90a-real"),
exits 1 unless every listed entry is present.
Usage: fatbin_archs.py LIBRARY [--expect ARCHS]"""

import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "sass"}


def section(path, name):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"{path}: not a 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)

    names = header(shstrndx)
    for i in range(shnum):
        h = header(i)
        start = names[4] + h[0]
        if data[start : data.index(b"\0", start)].decode() == name:
            return data[h[4] : h[4] + h[5]]
    return b""


def entries(blob):
    out, pos = [], 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; skip padding
            continue
        e, end = pos + header_size, pos + header_size + fat_size
        while e + 32 <= end:
            kind, _u, e_header, e_size = struct.unpack_from("<HHIQ", blob, e)
            (arch,) = struct.unpack_from("<I", blob, e + 28)
            if e_header == 0:
                break
            out.append((KINDS.get(kind, f"kind{kind}"), arch))
            e += e_header + e_size
        pos = end
    return out


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    found = entries(section(args[0], ".nv_fatbin"))
    names = sorted({f"{k} {'compute' if k == 'ptx' else 'sm'}_{a}" for k, a in found})
    print("\n".join(names) if names else "no CUDA code")
    if len(args) == 3 and args[1] == "--expect":
        missing = []
        for item in filter(None, args[2].split(";")):
            num, _, kind = item.partition("-")
            arch = int(num.rstrip("af"))
            kinds = {"real": ["sass"], "virtual": ["ptx"]}.get(kind, ["sass", "ptx"])
            missing += [f"{k} for {item}" for k in kinds if (k, arch) not in found]
        if missing:
            print("missing: " + ", ".join(missing))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
