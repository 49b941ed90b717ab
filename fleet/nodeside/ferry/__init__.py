"""ferry: fleet's file mover. The same code runs on this machine (the sender's half, imported as
fleet.nodeside.ferry) and on every node (`hash|recv|send|list ...`, standard library only, Python
3.8+), where its modules go as one program (fleet.transport.transfer.agent.program), so that
sending to nodes and pulling from them are one engine.

The stream is a sequence of frames, each a kind byte and a 4-byte length, then the payload:

  F  a file begins: JSON {"root", "path", "size", "mode", "mtime", "blocks", "for"}; no
     set-id or sticky bit and no write for others is ever applied (MODE_MASK).
     `blocks` lists the indices of the BLOCK-sized pieces that follow (null: all of them);
     the receiver takes every other piece from what it already has (its partial file, else
     the file itself), verified: the pieces were chosen by comparing their hashes.
     `for` lists the receivers that write the file; the others only pass it on.
  D  one block's bytes, in block order.
  E  the file ends: JSON {"sha256"}: the whole file's hash as the sender read it. The receiver
     hashes what it assembled while it writes; only an equal hash makes the file replace the
     old one (renamed into place), else the partial file is removed and an error reported.
  X  the sender gave the file up (it changed while it was read): the partial file is kept,
     its verified pieces the start of the next attempt.
  T  a file whose content the receiver already has (same hash): JSON {"root", "path", "mtime",
     "mode", "for"}: only its time and mode are set.
  Z  the end.

A file is written to `.NAME.fleet-part` beside its target and renamed only once verified, so a
reader never sees half a file, and an interrupted transfer leaves what arrived for the next one
to verify and keep (`hash` lists a partial file's pieces in place of the file's).

A receiver (`recv`) reads the stream from its stdin or from the node before it (a TCP
connection, authenticated both ways with an HMAC of a per-transfer key that only reaches it on
stdin), passes every frame on to the node after it before writing it, and reports on stdout, one
JSON object a line: {"port"}, {"linked"}, {"at": bytes in place},
{"waiting": seconds what it passes on has moved no byte}, {"ok": [root, path, sha256 ("" for
a touch)]}, {"error": {...}} ("tampered" in it: a relayed frame that fleet's word belies),
{"done": {...}}. It ends
when the stream ends, and at once when its stdin closes (fleet gone, or stopping it).

The modules, in the order the node's program has them: frames (names, blocks, hashing, the
frame format), send, word (fleet's word to a relayed node), receiver, recv (the relay link and
`recv`), main. Each imports what it needs from those before it, by name.
"""

from __future__ import annotations

from fleet.nodeside.ferry.frames import (
    BLOCK,
    DIGEST_HEX,
    HEAD,
    MAX_META,
    PART,
    Bad,
    Json,
    Linked,
    _exactly,
    block_len,
    blocks_of,
    cmd_hash,
    digest,
    frame,
    hash_file,
    kept_from,
    meta,
    part_name,
    part_of,
    read_frame,
    safe_rel,
    target,
)
from fleet.nodeside.ferry.main import main
from fleet.nodeside.ferry.receiver import MODE_MASK, Receiver, _problem, forget_bytecode
from fleet.nodeside.ferry.recv import (
    CONNECT_S,
    STALL_S,
    Forward,
    accept_from,
    cmd_recv,
    link_to,
)
from fleet.nodeside.ferry.send import (
    AHEAD,
    LIST_MAX,
    Changed,
    Unreadable,
    cmd_list,
    cmd_send,
    send_file,
)
from fleet.nodeside.ferry.word import Head, Tampered, Word

# What fleet.transport.transfer and the tests use (mypy --strict re-exports only what is listed)
__all__ = [
    "AHEAD", "BLOCK", "LIST_MAX", "CONNECT_S", "DIGEST_HEX", "HEAD", "MAX_META", "MODE_MASK",
    "PART", "STALL_S", "Bad", "Changed", "Forward", "Head", "Json", "Linked", "Receiver",
    "Tampered", "Unreadable", "Word", "_exactly", "_problem",
    "accept_from", "block_len", "blocks_of", "cmd_hash", "cmd_list", "cmd_recv", "cmd_send",
    "digest", "forget_bytecode", "frame", "hash_file", "kept_from", "link_to", "main", "meta",
    "part_name", "part_of", "read_frame", "safe_rel", "send_file", "target",
]
