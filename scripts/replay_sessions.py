#!/usr/bin/env python3
"""Replay the session ranking of a `bench-recall --candidates` dump with other weights.

Each line of the dump holds one question's first 300 hybrid candidates in the
engine's order, with every leg's raw score and the ranking factors. The fused
score is recomputed from them exactly as `service::search::fuse` does (score
fusion: each leg's relevance, BM25 and graph over the leg's best, vector as
1 - cosine distance, weighted and divided by the default weights' sum, times
the factors' product); a dump whose scores do not recompute is refused. Only
the score a result lends its session changes: the memories' own order (and
with it every turn figure) stays the engine's, and the sessions are grouped as
`search::sessions::rank` groups them (best result plus `--rest` times the
others', over the first `--pool` results).

    python3 scripts/replay_sessions.py bench-results/candidates-<time>.jsonl \
        --bm25 0.4,0.3 --rest 0.1,0.2 --pool 50,100

prints, for each combination, session recall_all@5, recall_all@10 and
recall_any@1 over the answerable questions (abstention questions left out).
"""

import argparse
import itertools
import json
import sys

# The shipped `[search]` weights the dump was fused with.
WEIGHTS = {"bm25": 0.4, "vector": 0.6, "graph": 0.1}
FACTORS = ("decay", "importance", "feedback", "access", "speaker", "time")


def session_of(turn):
    """A turn id is `<session>_<turn number>`."""
    return turn.rsplit("_", 1)[0]


def lent(question, weights):
    """Each candidate's final score with the legs weighed by `weights`."""
    cands = question["candidates"]
    best = {}
    for c in cands:
        for leg in ("bm25", "graph"):
            if leg in c["legs"]:
                best[leg] = max(best.get(leg, 0.0), c["legs"][leg]["score"])
    norm = sum(WEIGHTS.values())
    scores = []
    for c in cands:
        fused = 0.0
        for leg, weight in weights.items():
            hit = c["legs"].get(leg)
            if hit is None:
                continue
            raw = hit["score"]
            if leg == "vector":
                relevance = 1.0 - raw
            else:
                relevance = raw / best[leg] if best.get(leg, 0.0) > 0 else 0.0
            fused += weight * min(max(relevance, 0.0), 1.0)
        product = 1.0
        for f in FACTORS:
            product *= c["factors"][f]
        scores.append(fused / norm * product)
    return scores


def sessions(question, scores, rest, pool):
    """Sessions best first, as `search::sessions::rank` ranks them."""
    total, first = {}, {}
    for i, c in enumerate(question["candidates"][:pool]):
        seen = []
        for t in c["turns"]:
            s = session_of(t)
            if s not in seen:
                seen.append(s)
        for s in seen:
            if s in total:
                total[s] += rest * scores[i]
            else:
                total[s], first[s] = scores[i], i
    return sorted(total, key=lambda s: (-total[s], first[s]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dump")
    p.add_argument("--bm25", default="0.4", help="BM25 weights to try, comma-separated")
    p.add_argument("--rest", default="0.1", help="rest weights to try, comma-separated")
    p.add_argument("--pool", default="50", help="how many results are grouped, comma-separated")
    args = p.parse_args()
    with open(args.dump) as f:
        questions = [json.loads(line) for line in f if line.strip()]
    off = sum(
        abs(c["score"] - s) > 1e-3
        for q in questions
        for c, s in zip(q["candidates"], lent(q, WEIGHTS))
    )
    if off:
        sys.exit(f"{off} candidates' scores do not recompute: a dump of other weights or code")
    answerable = [q for q in questions if not q["abstention"]]
    print("bm25  rest  pool  all@5  all@10  any@1  (of %d)" % len(answerable))
    rests = [float(x) for x in args.rest.split(",")]
    pools = [int(x) for x in args.pool.split(",")]
    for bm25 in (float(x) for x in args.bm25.split(",")):
        # The scores depend on the weights alone: once per question.
        weights = dict(WEIGHTS, bm25=bm25)
        lents = [lent(q, weights) for q in answerable]
        for rest, pool in itertools.product(rests, pools):
            all5 = all10 = any1 = 0
            for q, scores in zip(answerable, lents):
                ranked = sessions(q, scores, rest, pool)
                evidence = set(q["answer_sessions"])
                all5 += evidence <= set(ranked[:5])
                all10 += evidence <= set(ranked[:10])
                any1 += bool(evidence & set(ranked[:1]))
            print(f"{bm25:<5} {rest:<5} {pool:<5} {all5:<6} {all10:<7} {any1}")


if __name__ == "__main__":
    main()
