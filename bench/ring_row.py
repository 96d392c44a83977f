#!/usr/bin/env python3
"""Turns one `ringattn run --json` line (stdin) into the ring benchmark's table rows, and,
given a third argument, appends the same rows as JSON objects to that file (JSONL)."""
import json
import sys


def main():
    name, p = sys.argv[1], int(sys.argv[2])
    j = json.loads(sys.stdin.read())
    n, h, d = j["seq_len"], j["heads"], j["head_dim"]
    # What a dense ring sends per rank: every other rank's whole K/V shard, fp32.
    dense_ring = (p - 1) * (n // p) * h * d * 2 * 4 * j["batch"]
    for pass_, ranks, ms in (("fwd", j.get("fwd_ranks"), j["fwd_ms"]),
                             ("bwd", j.get("bwd_ranks"), j.get("bwd_ms", 0.0))):
        if not ranks:
            ranks = [{"compute_ms": ms, "comm_ms": 0.0, "exposed_ms": 0.0, "bytes_sent": 0}]
        comp = [r["compute_ms"] for r in ranks]
        mean = sum(comp) / len(comp)
        exposed = max(r["exposed_ms"] for r in ranks)
        comm = max(r["comm_ms"] for r in ranks)
        sent = max(r["bytes_sent"] for r in ranks)
        ring = str(dense_ring) if pass_ == "fwd" else ""
        if len(sys.argv) > 3:
            with open(sys.argv[3], "a") as f:
                f.write(json.dumps({
                    "config": name, "P": p, "N": n, "pass": pass_, "ms": ms,
                    "compute_ms": max(comp), "comm_ms": comm, "exposed_ms": exposed,
                    "exposed_over_compute": exposed / max(comp), "imbalance": max(comp) / mean,
                    "bytes_sent": sent, "dense_ring_bytes": dense_ring if pass_ == "fwd" else None,
                    "heads": h, "head_dim": d}) + "\n")
        print(f"{name:<24} {p:>2} {n:>7} {pass_:>4} {ms:>10.1f} {max(comp):>10.1f} {comm:>9.1f}"
              f" {exposed:>9.1f} {100 * exposed / max(comp):>6.1f}% {max(comp) / mean:>6.3f}"
              f" {sent:>12} {ring:>12}")


if __name__ == "__main__":
    main()
