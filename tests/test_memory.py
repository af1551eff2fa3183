"""The memory guard: a belief that cannot fit is refused before anything is allocated."""

import time

import numpy as np
import pytest

import refbayes as rb
from refbayes import memory
from refbayes.errors import InsufficientMemoryError


def test_a_full_ekf_over_a_million_parameters_is_refused_at_once(monkeypatch):
    monkeypatch.setenv("REFBAYES_MEMORY_LIMIT", str(24 * 2**30))
    model = rb.MLP([100, 1000, 1000, 10])  # P = 1,112,010
    start = time.perf_counter()
    with pytest.raises(InsufficientMemoryError) as info:
        rb.FullEKF(model, rb.Gaussian(1.0))
    assert time.perf_counter() - start < 1.0
    msg = str(info.value)
    assert "FullEKF" in msg and "P = 1,112,010" in msg and "TiB" in msg and "LoFi(rank=10)" in msg
    # 2 P^2 float64 numbers (belief and the step's new matrix), plus the C x P Jacobian
    P = model.n_params
    assert info.value.needed == 8.0 * (2.0 * P * P + 10 * P)
    assert isinstance(info.value, MemoryError)


def test_a_small_full_ekf_is_built_and_the_limit_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("REFBAYES_MEMORY_LIMIT", "1000")
    with pytest.raises(InsufficientMemoryError):
        rb.FullEKF(rb.MLP([2, 8, 1]), rb.Gaussian(1.0))  # 33 parameters: 17 KiB > 1000 bytes
    monkeypatch.setenv("REFBAYES_MEMORY_LIMIT", "0")
    rb.FullEKF(rb.MLP([2, 8, 1]), rb.Gaussian(1.0))
    monkeypatch.delenv("REFBAYES_MEMORY_LIMIT")
    filt = rb.FullEKF(rb.MLP([2, 8, 1]), rb.Gaussian(1.0))
    assert filt.init(np.zeros(33)).cov.shape == (33, 33)


def test_available_memory_and_sizes_read_sensibly(monkeypatch):
    monkeypatch.delenv("REFBAYES_MEMORY_LIMIT", raising=False)
    avail = memory.available_bytes()
    assert avail is None or avail > 2**20
    assert memory.format_bytes(8 * 1_011_010**2) == "7.44 TiB"
    assert memory.format_bytes(512) == "512 B"
    monkeypatch.setenv("REFBAYES_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="REFBAYES_MEMORY_LIMIT"):
        memory.available_bytes()


@pytest.mark.parametrize("family", ["full", "full-moment"])
def test_bong_full_families_are_refused_when_they_cannot_fit(monkeypatch, family):
    monkeypatch.setenv("REFBAYES_MEMORY_LIMIT", str(24 * 2**30))
    model = rb.MLP([100, 1000, 1000, 10])  # P = 1,112,010
    with pytest.raises(InsufficientMemoryError) as info:
        rb.Bong(model, rb.Gaussian(1.0), family=family)
    assert f"Bong(family='{family}')" in str(info.value) and "P = 1,112,010" in str(info.value)
    # the DLR and diagonal families store O(P) numbers and are built
    for other in ("dlr", "diag"):
        assert rb.Bong(model, rb.Gaussian(1.0), family=other).n_params == model.n_params
