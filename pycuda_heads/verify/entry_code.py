"""What one kernel entry of a compiled module is made of, apart from the module's other entries.

A family's variant compiles to one module holding every entry of the family (pool's forward and
backward, say), but a launch runs one entry. The identity proof compares each tuned entry's own
code, so an edit to one entry's body does not stale the tuned launches of the others:

- PTX: the module's text with every other ``.entry`` block removed, and the module-level
  declarations nothing left refers to (another entry's ``__shared__`` arrays); device
  functions, globals and constants stay;
- cubin (ELF): every section except the other entries' own (``.text.NAME``, ``.nv.info.NAME``,
  ``.nv.constant0.NAME``, ``.nv.shared.NAME``, their relocations), the symbol and string
  tables, the call graph and the call-frame (debugger) info, with symbol indices replaced by
  names, and of the module-wide ``.nv.info`` only the records of this entry or of no other.
"""
from __future__ import annotations

import hashlib
import re
import struct

#: part of the identity cache's key: changed whenever what an entry's digests cover changes
VERSION = 2
_ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)
# a module-level declaration of a variable: its name
_DECL = re.compile(r"^(?:\.extern |\.visible |\.weak )*\.(?:shared|global|const)\b[^;]*?(\w+)(?:\[\d*\])?"
                   r"(?: = [^;]*)?;\n", re.M)
_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 2, 4, 8, 9
_DROPPED = {".shstrtab", ".strtab", ".symtab", ".symtab_shndx", ".nv.callgraph", ".debug_frame",
            ".rela.debug_frame", ".rel.debug_frame"}
_EIFMT_SVAL = 0x04
# .nv.info attributes whose value starts with a symbol's index: PARAM_CBANK, FRAME_SIZE,
# MIN_STACK_SIZE, MAX_STACK_SIZE, REGCOUNT
_BY_SYMBOL = {0x0A, 0x11, 0x12, 0x23, 0x2F}


def ptx_entries(ptx: str) -> list[str]:
    """The names of the module's kernel entries."""
    return _ENTRY.findall(ptx)


def _without_block(ptx: str, name: str) -> str:
    """``ptx`` without entry ``name``'s block: its header line to the brace that closes its body.
    Braces are counted, not found at column 0: an inline-asm scope (``{ .reg .pred p; ... }``)
    closes at column 0 inside a body."""
    head = re.search(rf"^\.visible \.entry {re.escape(name)}\(", ptx, re.M)
    depth = 0
    for close in range(ptx.index("{", head.end()), len(ptx)):
        depth += (ptx[close] == "{") - (ptx[close] == "}")
        if depth == 0:
            break
    return ptx[:head.start()] + ptx[close + 1 + (ptx[close + 1:close + 2] == "\n"):]


def entry_ptx(ptx: str, entry: str) -> str:
    """``ptx`` without the blocks of its entries other than ``entry``."""
    if entry not in ptx_entries(ptx):
        raise ValueError(f"no .entry {entry} in the PTX")
    for other in ptx_entries(ptx):
        if other != entry:
            ptx = _without_block(ptx, other)
    for m in reversed(list(_DECL.finditer(ptx))):
        if len(re.findall(rf"\b{re.escape(m.group(1))}\b", ptx)) == 1:
            ptx = ptx[:m.start()] + ptx[m.end():]
    return ptx


def _sections(elf: bytes) -> list[dict]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    out = []
    for i in range(shnum):
        (name, typ, flags, _addr, offset, size, link, info, _align,
         entsize) = struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
        data = b"" if typ == _SHT_NOBITS else elf[offset:offset + size]
        out.append({"name_at": name, "type": typ, "flags": flags, "size": size, "link": link,
                    "info": info, "entsize": entsize, "data": data})
    names = out[shstrndx]["data"]
    for s in out:
        s["name"] = names[s["name_at"]:names.index(b"\0", s["name_at"])].decode()
    return out


def _symbols(sections: list[dict]) -> list[str]:
    """Symbol names by index."""
    symtab = next((s for s in sections if s["type"] == _SHT_SYMTAB), None)
    if symtab is None:
        return []
    strings = sections[symtab["link"]]["data"]
    names = []
    for at in range(0, len(symtab["data"]), 24):
        name, = struct.unpack_from("<I", symtab["data"], at)
        names.append(strings[name:strings.index(b"\0", name)].decode())
    return names


def _info(data: bytes, symbols: list[str], others: set[str]) -> bytes:
    """.nv.info records with their symbol indices written as names; those of another entry
    dropped (the module-wide section holds every function's register count and stack)."""
    out, at = [], 0
    while at + 4 <= len(data):
        fmt, attr, value = struct.unpack_from("<BBH", data, at)
        size = value if fmt == _EIFMT_SVAL else 0
        payload = data[at + 4:at + 4 + size]
        at += 4 + size
        if attr in _BY_SYMBOL and size >= 4:
            sym, = struct.unpack_from("<I", payload)
            if symbols[sym] in others:
                continue
            payload = symbols[sym].encode() + b"\0" + payload[4:]
        out.append(bytes((fmt, attr)) + payload)
    return b"|".join(out)


def _relocations(s: dict, symbols: list[str]) -> bytes:
    step = 24 if s["type"] == _SHT_RELA else 16
    out = []
    for at in range(0, len(s["data"]), step):
        offset, info = struct.unpack_from("<QQ", s["data"], at)
        sym, kind = info >> 32, info & 0xFFFFFFFF
        rest = s["data"][at + 16:at + step]
        out.append(struct.pack("<QI", offset, kind) + symbols[sym].encode() + rest)
    return b"|".join(out)


def entry_cubin_digest(cubin: bytes, entry: str, entries: list[str]) -> str:
    """sha256 of what launching ``entry`` of ``cubin`` depends on (``entries``: every entry of
    the module, as ``ptx_entries`` read them)."""
    if entry not in entries:
        raise ValueError(f"{entry} is not among the module's entries {entries}")
    others = set(entries) - {entry}
    sections = _sections(cubin)
    symbols = _symbols(sections)
    h = hashlib.sha256()
    for s in sections:
        name = s["name"]
        if name in _DROPPED or any(name.endswith("." + o) for o in others):
            continue
        if name == ".nv.info" or name.startswith(".nv.info."):
            body = _info(s["data"], symbols, others)
        elif s["type"] in (_SHT_REL, _SHT_RELA):
            body = _relocations(s, symbols)
        else:
            body = s["data"]
        # a .text section's info holds its register count (top byte) and its symbol's index;
        # another section's, the index of the section it belongs to
        info = s["info"]
        if name.startswith(".text.") and symbols:
            info = (info >> 24, symbols[info & 0xFFFFFF])
        elif 0 < info < len(sections):
            info = sections[info]["name"]
        h.update(repr((name, s["type"], s["flags"], s["size"], info, s["entsize"])).encode())
        h.update(hashlib.sha256(body).digest())
    return h.hexdigest()
