"""The standard offline throughput workload (nano-vllm's and vLLM's throughput benchmark).

``num_requests`` requests; each prompt is random token ids of a length uniform in ``[min_len, max_len]``,
each output length uniform in the same range, EOS ignored so every request produces exactly its
output length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.errors import ParameterError


@dataclass(frozen=True)
class OfflineWorkload:
    prompts: list[list[int]]
    output_lens: list[int]
    seed: int

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def max_total_len(self) -> int:
        return max(len(p) + n for p, n in zip(self.prompts, self.output_lens, strict=True))

    def head(self, n: int) -> OfflineWorkload:
        return OfflineWorkload(self.prompts[:n], self.output_lens[:n], self.seed)


def offline_workload(
    num_requests: int = 256, min_len: int = 100, max_len: int = 1024, *, vocab: int, seed: int = 0
) -> OfflineWorkload:
    if num_requests < 1 or min_len < 1 or max_len < min_len:
        raise ParameterError(
            f"need num_requests >= 1 and 1 <= min_len <= max_len, got {num_requests}, {min_len}, {max_len}"
        )
    if vocab < 2:
        raise ParameterError(f"vocab must be >= 2, got {vocab}")
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(min_len, max_len + 1, num_requests)
    output_lens = rng.integers(min_len, max_len + 1, num_requests)
    prompts = [rng.integers(0, vocab, n).tolist() for n in prompt_lens]
    return OfflineWorkload(prompts, [int(n) for n in output_lens], seed)
