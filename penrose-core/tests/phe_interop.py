"""Interoperability peer for tests/phe_interop.rs: python-paillier (phe) on the other side.

Reads one JSON object on stdin:
  private_key: hex of penrose's private key bytes (version 1: "PNSK" | 01 | bits u16 | p | q | h_s)
  slot_bits, slots_per_ciphertext: the packed layout
  ciphertexts: hex ciphertexts penrose made (one packed histogram)
  bins: a histogram for phe to pack and encrypt
Writes one JSON object on stdout:
  decrypted_bins: phe's decryption of `ciphertexts`, unpacked here
  ciphertexts: hex ciphertexts phe made of `bins`, fixed length like penrose's
  h_s_plaintext: phe's decryption of h_s (an encryption of zero if h_s is an n-th residue)
Exit status 3 with a message on stderr when phe cannot be imported.
"""

import json
import sys

try:
    from phe import paillier
except ImportError as error:
    sys.stderr.write(
        "python-paillier (phe) is not importable: %s. Install it with `pip install phe`, "
        "or set PENROSE_SKIP_PHE=1 (developers only).\n" % error
    )
    sys.exit(3)


def parse_private_key(data):
    if data[:4] != b"PNSK":
        raise ValueError("not a penrose private key (tag %r)" % data[:4])
    if data[4] != 1:
        raise ValueError("unknown private key version %d" % data[4])
    bits = int.from_bytes(data[5:7], "big")
    half = bits // 16
    body = data[7:]
    p = int.from_bytes(body[:half], "big")
    q = int.from_bytes(body[half : 2 * half], "big")
    h_s = int.from_bytes(body[2 * half :], "big")
    return bits, p, q, h_s


def main():
    request = json.load(sys.stdin)
    bits, p, q, h_s = parse_private_key(bytes.fromhex(request["private_key"]))
    public = paillier.PaillierPublicKey(p * q)
    private = paillier.PaillierPrivateKey(public, p, q)
    width = request["slot_bits"]
    slots = request["slots_per_ciphertext"]
    mask = (1 << width) - 1
    ciphertext_bytes = bits // 4

    decrypted_bins = []
    for text in request["ciphertexts"]:
        plaintext = private.raw_decrypt(int(text, 16))
        for _ in range(slots):
            decrypted_bins.append(plaintext & mask)
            plaintext >>= width
        if plaintext != 0:
            raise ValueError("plaintext has bits beyond its slots")
    bins = request["bins"]
    decrypted_bins = decrypted_bins[: len(bins)]

    ciphertexts = []
    for start in range(0, len(bins), slots):
        packed = 0
        for value in reversed(bins[start : start + slots]):
            packed = (packed << width) | value
        ciphertext = public.raw_encrypt(packed)
        ciphertexts.append(ciphertext.to_bytes(ciphertext_bytes, "big").hex())

    json.dump(
        {
            "decrypted_bins": decrypted_bins,
            "ciphertexts": ciphertexts,
            "h_s_plaintext": str(private.raw_decrypt(h_s)),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
