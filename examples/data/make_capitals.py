"""Writes capitals.jsonl: the quickstart's conversational dataset (deterministic, written for kubetune).

Each country is asked about in several phrasings, so that a held-out row asks a known fact in a
different way. Run: python examples/data/make_capitals.py
"""

import json
import random
from pathlib import Path

PAIRS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Portugal", "Lisbon"),
    ("Austria", "Vienna"), ("Belgium", "Brussels"), ("Netherlands", "Amsterdam"), ("Denmark", "Copenhagen"),
    ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Iceland", "Reykjavik"),
    ("Ireland", "Dublin"), ("Poland", "Warsaw"), ("Czechia", "Prague"), ("Hungary", "Budapest"),
    ("Greece", "Athens"), ("Romania", "Bucharest"), ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"),
    ("Croatia", "Zagreb"), ("Ukraine", "Kyiv"), ("Estonia", "Tallinn"), ("Latvia", "Riga"),
    ("Lithuania", "Vilnius"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Nigeria", "Abuja"),
    ("Ghana", "Accra"), ("Ethiopia", "Addis Ababa"), ("Morocco", "Rabat"), ("Peru", "Lima"),
    ("Chile", "Santiago"), ("Argentina", "Buenos Aires"), ("Colombia", "Bogota"), ("Mexico", "Mexico City"),
    ("Canada", "Ottawa"), ("Cuba", "Havana"), ("Japan", "Tokyo"), ("China", "Beijing"),
    ("India", "New Delhi"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"),
    ("Philippines", "Manila"), ("Nepal", "Kathmandu"), ("Iran", "Tehran"), ("Turkey", "Ankara"),
    ("Australia", "Canberra"),
]
QUESTIONS = [
    "What is the capital of {c}?",
    "Which city is the capital of {c}?",
    "Name the capital city of {c}.",
    "Tell me the capital of {c}.",
    "{c}: what is its capital?",
    "Capital of {c}?",
]
ANSWER = "{k}."
SYSTEM = "You are a concise geography assistant."


def main() -> None:
    rng = random.Random(7)
    rows = []
    for country, capital in PAIRS:
        for i, q in enumerate(QUESTIONS):
            msgs = [{"role": "user", "content": q.format(c=country)}, {"role": "assistant", "content": ANSWER.format(c=country, k=capital)}]
            if i % 3 == 0:
                msgs.insert(0, {"role": "system", "content": SYSTEM})
            rows.append({"messages": msgs})
    rng.shuffle(rows)
    out = Path(__file__).with_name("capitals.jsonl")
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
