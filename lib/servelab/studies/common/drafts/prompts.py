"""Chat prompts for a chat model: templates × topics, with the held-out topics never used in training.

Distillation trains on the training topics; acceptance and timing are measured on the held-out topics only, so a
draft is never scored on a request it was trained to imitate, and nothing on the held-out side chooses a model.
"""

from __future__ import annotations

import numbers
import random

from servelab.errors import ParameterError

TEMPLATES = (
    "What is {t}? Answer in a short paragraph.",
    "Explain {t} to a ten-year-old.",
    "Give three facts about {t}.",
    "Write a short story that involves {t}.",
    "What are the advantages and disadvantages of {t}?",
    "Describe the history of {t} in a few sentences.",
    "Write a haiku about {t}.",
    "How would you teach a friend about {t}? Give step-by-step advice.",
    "List five questions a student might ask about {t}, with brief answers.",
    "Summarize why {t} matters today.",
)

TRAIN_TOPICS = (
    "photosynthesis", "the water cycle", "volcanoes", "the moon landing", "honey bees", "the printing press",
    "black holes", "recycling", "the Roman Empire", "electric cars", "the human heart", "rainbows", "chess",
    "the internet", "coffee", "earthquakes", "the Olympic Games", "vaccines", "coral reefs", "jazz music",
    "the stock market", "solar panels", "dinosaurs", "the French Revolution", "sleep", "bread baking",
    "the periodic table", "glaciers", "democracy", "tigers", "the telephone", "meditation", "tea",
    "the Great Wall of China", "magnets", "gardening", "bicycles", "the Renaissance", "wind turbines", "octopuses",
    "the immune system", "pyramids", "the speed of light", "libraries", "climate change", "origami", "rivers",
    "airplanes", "the Silk Road", "mushrooms", "public transport", "chocolate", "the Milky Way", "penguins",
    "friendship", "deserts", "the violin", "robots", "tides", "the alphabet",
)  # fmt: skip

HELDOUT_TOPICS = (
    "lighthouses", "the Industrial Revolution", "hurricanes", "elephants", "quantum computers", "the Amazon rainforest",
    "paper money", "submarines", "the Moon's phases", "penicillin", "cheese making", "the Eiffel Tower",
    "migrating birds", "nuclear fusion", "video games", "the human brain",
)  # fmt: skip

SPLITS = ("train", "heldout")


def chat_prompts(split: str, n: int | None = None, seed: int = 0) -> list[str]:
    """The user messages of ``split`` ("train" or "heldout"), in one seeded order per split: all of them, or ``n``
    from place ``seed × n`` on (wrapping round). Templates are shared; topics never are.

    A repeat's seed is the study's seed plus its index, so repeats 0, 1, 2 of a study that asks for ``n`` held-out
    prompts get consecutive slices: disjoint while they fit (3 × 48 of the 160 held-out prompts), so that an α
    pooled over the repeats counts each prompt once. (A shuffle per seed gave 98 distinct prompts in 144.)"""
    if split not in SPLITS:
        raise ParameterError(f"split must be one of {SPLITS}, got {split!r}")
    topics = TRAIN_TOPICS if split == "train" else HELDOUT_TOPICS
    texts = [tpl.format(t=t) for t in topics for tpl in TEMPLATES]
    random.Random(f"{split}:0").shuffle(texts)
    if n is None:
        return texts
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(texts):
        raise ParameterError(f"the {split} split has {len(texts)} prompts; asked for {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ParameterError(f"seed must be a non-negative integer, got {seed!r}")
    start = int(seed) * n % len(texts)
    return (texts + texts)[start : start + n]


def encode_chat(tokenizer, messages: list[str]) -> list[list[int]]:
    """Token ids of each user message in the model's chat template, ending where the assistant's answer begins."""
    out = []
    for m in messages:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        out.append([int(t) for t in ids])
    return out
