"""Section 5 of the original package's API (``atomr_accel.rng``): ``RngGenerator``'s names,
generator kinds and every distribution's ``_f32``/``_f64`` form, on the CPU backend, checked
against the distributions' moments and SciPy's CDFs."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import numpy as np
import pytest
from scipy import stats

from atomr_accel import Device, GpuRuntimeError, System
from atomr_accel.rng import RngGenerator

SIGNATURES = {
    "uniform": "buf lo hi", "normal": "buf mean std", "log_normal": "buf mean std",
    "poisson": "buf lam", "exponential": "buf lam", "beta": "buf alpha beta",
    "cauchy": "buf loc scale", "gamma": "buf shape scale", "discrete": "buf weights",
}
KINDS = ["default", "pseudo_default", "philox", "philox4_32_10", "PHILOX_4_32_10", "xorwow",
         "mrg32k3a", "mtgp32", "sobol32", "scrambled_sobol32", "sobol64", "scrambled_sobol64"]
N = 20_000


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("original-rng") as system:
        yield system.spawn_device(mock=True)


@pytest.mark.parametrize("suffix", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_names_and_signatures(name: str, suffix: str) -> None:
    for method in (getattr(RngGenerator, f"{name}_{suffix}"),
                   getattr(RngGenerator, f"{name}_{suffix}_async")):
        params = [p.name for p in inspect.signature(method).parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert params[1:] == [*SIGNATURES[name].split(), "timeout_secs"]
        assert inspect.signature(method).parameters["timeout_secs"].default == 10.0
    for other in ("uniform_u32", "set_seed", "set_generator"):
        assert callable(getattr(RngGenerator, other))
        assert callable(getattr(RngGenerator, f"{other}_async"))


def draw(dev: Device, fill: str, dtype: type, *params: object) -> np.ndarray:
    gen = dev.rng()
    gen.set_seed(1234)
    buf = dev.allocate(N, dtype)
    getattr(gen, f"{fill}_{'f32' if dtype is np.float32 else 'f64'}")(buf, *params)
    return dev.copy_to_numpy(buf).astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_distribution_draws_what_it_says(dev: Device, dtype: type) -> None:
    ks = {
        "uniform": ((-2.0, 3.0), stats.uniform(-2.0, 5.0)),
        "normal": ((1.0, 2.0), stats.norm(1.0, 2.0)),
        "log_normal": ((0.1, 0.5), stats.lognorm(0.5, scale=np.exp(0.1))),
        "exponential": ((4.0,), stats.expon(scale=0.25)),  # the original takes the rate
        "beta": ((2.0, 5.0), stats.beta(2.0, 5.0)),
        "cauchy": ((1.0, 0.5), stats.cauchy(1.0, 0.5)),
        "gamma": ((3.0, 2.0), stats.gamma(3.0, scale=2.0)),
    }
    for fill, (params, law) in ks.items():
        sample = draw(dev, fill, dtype, *params)
        assert stats.kstest(sample, law.cdf).pvalue > 1e-4, fill
    counts = draw(dev, "poisson", dtype, 3.5)
    assert np.all(counts == np.round(counts)) and abs(counts.mean() - 3.5) < 6 * np.sqrt(3.5 / N)


def test_discrete_follows_its_weights(dev: Device) -> None:
    weights = np.array([1.0, 0.0, 3.0, 6.0], np.float32)
    w = dev.allocate_f32(4)
    dev.copy_from_numpy(w, weights)
    sample = draw(dev, "discrete", np.float32, w)
    observed = np.bincount(sample.astype(int), minlength=4)
    assert observed[1] == 0
    expected = N * weights / weights.sum()
    assert stats.chisquare(observed[[0, 2, 3]], expected[[0, 2, 3]]).pvalue > 1e-4


def test_uniform_u32_and_seeds(dev: Device) -> None:
    gen = dev.rng()
    a, b = dev.allocate_u32(1000), dev.allocate_u32(1000)
    gen.set_seed(5)
    gen.uniform_u32(a)
    gen.set_seed(5)
    gen.uniform_u32(b)
    np.testing.assert_array_equal(dev.copy_to_numpy(a), dev.copy_to_numpy(b))
    gen.set_seed(6)
    gen.uniform_u32(b)
    assert not np.array_equal(dev.copy_to_numpy(a), dev.copy_to_numpy(b))
    assert dev.copy_to_numpy(a).max() > 1 << 30


@pytest.mark.parametrize("kind", KINDS)
def test_every_generator_kind_continues_its_stream(dev: Device, kind: str) -> None:
    gen = dev.rng()
    gen.set_generator(kind)
    gen.set_seed(77)
    whole, halves = dev.allocate_f64(64), dev.allocate_f64(64)
    gen.uniform_f64(whole)
    gen.set_seed(77)
    gen.uniform(halves, length=32)
    first = dev.copy_to_numpy(halves)[:32].copy()
    gen.uniform(halves, length=32)
    np.testing.assert_array_equal(np.concatenate([first, dev.copy_to_numpy(halves)[:32]]),
                                  dev.copy_to_numpy(whole))


def test_bad_names_and_parameters_are_typed_errors(dev: Device) -> None:
    gen = dev.rng()
    with pytest.raises(GpuRuntimeError, match="xorwow"):
        gen.set_generator("lcg")
    buf = dev.allocate_f32(8)
    for bad in (lambda: gen.beta_f32(buf, -1.0, 2.0), lambda: gen.gamma_f32(buf, 0.0, 1.0),
                lambda: gen.exponential_f32(buf, 0.0), lambda: gen.uniform_f32(buf, 2.0, 1.0),
                lambda: gen.normal_f64(buf), lambda: gen.set_seed(-1)):
        with pytest.raises(GpuRuntimeError):
            bad()
