"""Name -> function tables for the choices a job spec makes by name: advantage estimator, policy loss,
loss aggregation, KL estimator.

The names are the spec's catalogue's (`spec/catalogue/algorithms.py`), so the spec, the CRD's `enum` lists
and the operator read them without torch: registering a function under a name the catalogue lacks is a
`CatalogueMismatch` at once, and `load()` raises one when a name the catalogue lists has no function. The
tables fill up when the torch modules that hold the functions are imported; `load()` does that in one
call, so a trainer writes::

    from decentralized_verl.algorithms import registry
    registry.load()
    advantages, returns = registry.ADVANTAGE_ESTIMATORS[name](inputs, **hparams)

Estimators and policy losses are registered through a wrapper that lets the trainer pass one shared
dict to every function of the table ("call blindly"): each function receives only the keyword
arguments its own signature names, and a keyword that *no* registered function of the table knows is a
`TypeError`, so a typo in a config never vanishes silently. (Which settings make sense for which loss is
the spec's business: the catalogue's `LOSS_DEFAULTS` says, and the spec rules refuse the rest by field.)
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from decentralized_verl.spec.catalogue import check_listed, check_registry
from decentralized_verl.spec.catalogue.algorithms import (
    ADVANTAGE_ESTIMATOR_NAMES,
    KL_ESTIMATOR_NAMES,
    LOSS_AGGREGATION_NAMES,
    POLICY_LOSS_NAMES,
)

if TYPE_CHECKING:
    from torch import Tensor

    from decentralized_verl.algorithms.advantage_inputs import AdvantageInputs


class AdvantageFn(Protocol):
    """`fn(inputs, **hparams) -> (advantages [B, T], returns [B, T])`, zero at masked tokens."""

    def __call__(self, inputs: AdvantageInputs, **hparams: Any) -> tuple[Tensor, Tensor]: ...


AggregationFn = Callable[["Tensor", "Tensor"], "Tensor"]
"""`fn(per_token_loss [B, T], mask [B, T] bool) -> scalar`; masked positions are ignored."""

KlFn = Callable[["Tensor", "Tensor"], "Tensor"]
"""`fn(logprobs [B, T], ref_logprobs [B, T]) -> per-token KL [B, T]` (masking is the caller's)."""


class PolicyLossFn(Protocol):
    """`fn(logprobs, old_logprobs, advantages, mask, **settings) -> (scalar loss, metrics)`; [B, T] inputs.

    Every loss accepts `weights` ([B, T], detached per-token factors such as rollout-correction
    importance weights, multiplied onto the per-token loss before aggregation) and `aggregation`.
    """

    def __call__(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **settings: Any
    ) -> tuple[Tensor, dict[str, float]]: ...


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}
POLICY_LOSSES: dict[str, PolicyLossFn] = {}
POLICY_LOSS_AGGREGATIONS: dict[str, AggregationFn] = {}
KL_ESTIMATORS: dict[str, KlFn] = {}

# Keyword arguments each registered estimator / policy loss accepts, for the blind call.
_ESTIMATOR_HPARAMS: dict[str, frozenset[str]] = {}
_LOSS_SETTINGS: dict[str, frozenset[str]] = {}

_IMPLEMENTATIONS = (
    "decentralized_verl.algorithms.advantages",
    "decentralized_verl.algorithms.policy_loss",
    "decentralized_verl.algorithms.gspo",
    "decentralized_verl.algorithms.weighted_pg",
    "decentralized_verl.algorithms.kl",
)


def load() -> None:
    """Import the torch modules whose decorators fill the tables (idempotent), then check that every name
    the catalogue lists has its function."""
    for module in _IMPLEMENTATIONS:
        importlib.import_module(module)
    check_against_catalogue()


def check_against_catalogue() -> None:
    """`CatalogueMismatch` unless each table holds exactly the names the catalogue lists for it."""
    check_registry("advantage estimator", ADVANTAGE_ESTIMATORS, ADVANTAGE_ESTIMATOR_NAMES)
    check_registry("policy loss", POLICY_LOSSES, POLICY_LOSS_NAMES)
    check_registry("loss aggregation", POLICY_LOSS_AGGREGATIONS, LOSS_AGGREGATION_NAMES)
    check_registry("KL estimator", KL_ESTIMATORS, KL_ESTIMATOR_NAMES)


def known_estimator_hparams() -> frozenset[str]:
    """Every keyword some registered estimator accepts; anything else passed is a typo."""
    return frozenset().union(*_ESTIMATOR_HPARAMS.values()) if _ESTIMATOR_HPARAMS else frozenset()


def known_loss_settings() -> frozenset[str]:
    """Every keyword some registered policy loss accepts; anything else passed is a typo."""
    return frozenset().union(*_LOSS_SETTINGS.values()) if _LOSS_SETTINGS else frozenset()


def _keyword_only(fn: Callable[..., Any]) -> frozenset[str]:
    params = inspect.signature(fn).parameters.values()
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _check_new(table: dict[str, Any], declared: tuple[str, ...], kind: str, name: str) -> None:
    check_listed(kind, name, declared)
    if name in table:
        raise ValueError(f"{kind} {name!r} is registered twice")


def advantage_estimator(name: str) -> Callable[[Callable[..., Any]], AdvantageFn]:
    """Register `fn(inputs, *, hparam=default, ...)` under `name` for the spec to choose."""

    def register(fn: Callable[..., Any]) -> AdvantageFn:
        _check_new(ADVANTAGE_ESTIMATORS, ADVANTAGE_ESTIMATOR_NAMES, "advantage estimator", name)
        accepted = _keyword_only(fn)

        @functools.wraps(fn)
        def call(inputs: AdvantageInputs, **hparams: Any) -> tuple[Tensor, Tensor]:
            unknown = sorted(set(hparams) - known_estimator_hparams())
            if unknown:
                raise TypeError(
                    f"advantage estimator {name!r}: unknown hyperparameter(s) {unknown}; "
                    f"known: {sorted(known_estimator_hparams())}"
                )
            return fn(inputs, **{k: v for k, v in hparams.items() if k in accepted})

        _ESTIMATOR_HPARAMS[name] = accepted
        ADVANTAGE_ESTIMATORS[name] = call
        return call

    return register


def policy_loss(name: str) -> Callable[[Callable[..., Any]], PolicyLossFn]:
    """Register `fn(logprobs, old_logprobs, advantages, mask, *, setting=default, ...)` under `name`, the
    trainer looks it up by `algorithm.policyLoss` and calls it blindly (see the module docstring)."""

    def register(fn: Callable[..., Any]) -> PolicyLossFn:
        _check_new(POLICY_LOSSES, POLICY_LOSS_NAMES, "policy loss", name)
        accepted = _keyword_only(fn)

        @functools.wraps(fn)
        def call(
            logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **settings: Any
        ) -> tuple[Tensor, dict[str, float]]:
            unknown = sorted(set(settings) - known_loss_settings())
            if unknown:
                load()  # every loss module registered, so `known` is the whole table's
                unknown = sorted(set(settings) - known_loss_settings())
            if unknown:
                known = sorted(known_loss_settings())
                raise TypeError(f"policy loss {name!r}: unknown setting(s) {unknown}; known: {known}")
            chosen = {k: v for k, v in settings.items() if k in accepted}
            return fn(logprobs, old_logprobs, advantages, mask, **chosen)

        _LOSS_SETTINGS[name] = accepted
        POLICY_LOSSES[name] = call
        return call

    return register


def loss_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    """Register a way of reducing a per-token loss matrix to one scalar."""

    def register(fn: AggregationFn) -> AggregationFn:
        _check_new(POLICY_LOSS_AGGREGATIONS, LOSS_AGGREGATION_NAMES, "loss aggregation", name)
        POLICY_LOSS_AGGREGATIONS[name] = fn
        return fn

    return register


def kl_estimator(name: str) -> Callable[[KlFn], KlFn]:
    """Register a per-token estimator of KL(policy || reference) from sampled-token log-probs."""

    def register(fn: KlFn) -> KlFn:
        _check_new(KL_ESTIMATORS, KL_ESTIMATOR_NAMES, "KL estimator", name)
        KL_ESTIMATORS[name] = fn
        return fn

    return register


def lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    """`table[name]`, or a `ValueError` that lists the names the table does have."""
    if name not in table:
        load()
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(table)}") from None
