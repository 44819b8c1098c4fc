"""How many tokens the draft proposes per round (γ): fixed, or adapted to how many the target kept.

Both policies expose ``gamma`` (the next round's γ) and ``update(accepted, proposed)``.
"""

from __future__ import annotations

from servelab.errors import ParameterError


class FixedGamma:
    def __init__(self, gamma: int):
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise ParameterError(f"gamma must be a positive integer, got {gamma!r}")
        self.gamma = gamma
        self.max_gamma = gamma

    def update(self, accepted: int, proposed: int) -> None:
        pass

    def fresh(self) -> FixedGamma:
        return self

    @property
    def label(self) -> str:
        return str(self.gamma)


class AdaptiveGamma:
    """Grow γ by one after a round that kept every drafted token; shrink it by one after a round that kept
    fewer than half. A draft that agrees with the target earns longer rounds (more tokens per target
    forward); one that misses early stops wasting draft steps whose tokens would be thrown away."""

    def __init__(self, initial: int = 4, min_gamma: int = 1, max_gamma: int = 8):
        for name, v in (("initial", initial), ("min_gamma", min_gamma), ("max_gamma", max_gamma)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(f"{name} must be a positive integer, got {v!r}")
        if not min_gamma <= initial <= max_gamma:
            raise ParameterError(f"need min_gamma <= initial <= max_gamma, got {min_gamma}, {initial}, {max_gamma}")
        self.gamma, self.min_gamma, self.max_gamma = initial, min_gamma, max_gamma
        self.initial = initial

    def fresh(self) -> AdaptiveGamma:
        return AdaptiveGamma(self.initial, self.min_gamma, self.max_gamma)

    def update(self, accepted: int, proposed: int) -> None:
        if accepted >= proposed:
            self.gamma = min(self.gamma + 1, self.max_gamma)
        elif 2 * accepted < proposed:
            self.gamma = max(self.gamma - 1, self.min_gamma)

    @property
    def label(self) -> str:
        return f"adaptive({self.min_gamma}-{self.max_gamma})"


def gamma_policy(spec) -> FixedGamma | AdaptiveGamma:
    """``3`` → ``FixedGamma(3)``; ``"adaptive"`` → ``AdaptiveGamma()``; ``"adaptive:2:1:8"`` → initial 2, range 1–8."""
    if isinstance(spec, (FixedGamma, AdaptiveGamma)):
        return spec
    if isinstance(spec, str) and spec.startswith("adaptive"):
        parts = spec.split(":")[1:]
        try:
            nums = [int(x) for x in parts]
        except ValueError:
            raise ParameterError(f"adaptive gamma spec must be 'adaptive[:initial[:min:max]]', got {spec!r}") from None
        if len(nums) not in (0, 1, 3):
            raise ParameterError(f"adaptive gamma spec must be 'adaptive[:initial[:min:max]]', got {spec!r}")
        return AdaptiveGamma(*nums)
    return FixedGamma(spec)
