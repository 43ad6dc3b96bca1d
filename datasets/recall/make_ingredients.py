#!/usr/bin/env python3
"""Write ingredients.json (the bench-recall ingredients) from the filler pool and
the questions; `loomem bench-recall gen` turns it into LongMemEval-format files:

    python3 datasets/recall/make_ingredients.py
    loomem bench-recall gen --ingredients datasets/recall/ingredients.json \
        --sessions 30 --seed 7 --out datasets/recall/loomem_recall_s30.json
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from filler import FILLER  # noqa: E402
from questions_a import QUESTIONS_A  # noqa: E402
from questions_b import QUESTIONS_B  # noqa: E402

with open(os.path.join(here, "ingredients.json"), "w") as f:
    json.dump({"filler": FILLER, "questions": QUESTIONS_A + QUESTIONS_B}, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(f"{len(FILLER)} filler sessions, {len(QUESTIONS_A) + len(QUESTIONS_B)} questions")
