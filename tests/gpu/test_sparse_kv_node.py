"""GPU test of ``edgesdk.kernels.sparse_kv.run_node`` (what the ``EdgeSparseKVAttention`` TensorRT plugin launches)
against the node's reference semantics (:func:`edgesdk.reference.sparse_kv.attention_steps`, which the ONNX Runtime
op runs): calls of 1 to 33 new tokens, ragged cached lengths, K and V at different sparsities, the state updated in
place (aliased, as TensorRT binds it) or into separate output buffers. Outputs, workspace and the separate state
outputs are poisoned first; the state must equal the numpy cache byte for byte.
"""

import numpy as np
import pytest

from edgesdk.formats import sparse_kv as f
from edgesdk.kernels import sparse_kv as ks
from edgesdk.reference.sparse_kv import attention_steps

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _state_dev(cache: f.SparseKVCache):
    return [_dev(cache.k_rec.view(np.int8)), _dev(cache.v_rec.view(np.int8)), _dev(cache.k_ring), _dev(cache.v_ring)]


def _poisoned_like(ts):
    out = []
    for t in ts:
        p = torch.empty_like(t)
        if p.dtype == torch.float16:
            p.fill_(float("nan"))
        else:
            p.fill_(-85)  # 0xAB
        out.append(p)
    return out


@pytest.mark.parametrize("d, hq, hkv, ks_, vs_, aliased", [
    (64, 6, 2, 0.7, 0.5, True), (64, 9, 3, 0.5, 0.5, False), (128, 8, 1, 0.7, 0.7, True), (64, 4, 4, 0.0, 0.0, False)])
def test_run_node_equals_the_reference_steps(d, hq, hkv, ks_, vs_, aliased):
    rng = np.random.default_rng(d + hq)
    cfg = f.SparseKVConfig(d, hq, hkv, ks_, vs_, capacity=150, window=4, group=3)
    B, before = 2, np.array([3, 10], np.int32)
    k0 = (rng.standard_normal((B, hkv, 10, d)) * 2).astype(np.float16)
    host = f.SparseKVCache.prefill(cfg, k0, (rng.standard_normal(k0.shape) * 2).astype(np.float16), before)
    state = _state_dev(host)
    lengths = before.copy()
    stream = torch.cuda.current_stream().cuda_stream
    tactic, ws_bytes = ks.node_plan(cfg, B)
    for S in (5, 1, 7, 2, 33, 1):
        q = rng.standard_normal((B, hq, S, d)).astype(np.float16)
        k = (rng.standard_normal((B, hkv, S, d)) * 2).astype(np.float16)
        v = (rng.standard_normal((B, hkv, S, d)) * 2).astype(np.float16)
        lengths = lengths + S
        expect = attention_steps(host, q, k, v, 0.11)
        out = torch.full((B, hq, S, d), float("nan"), dtype=torch.float16, device="cuda")
        ws = torch.full((ws_bytes,), -85, dtype=torch.int8, device="cuda")
        new = state if aliased else _poisoned_like(state)
        qd, kd, vd, ld = _dev(q), _dev(k), _dev(v), _dev(lengths.astype(np.int32))
        ks.run_node(cfg, 0.11, B, S, qd.data_ptr(), kd.data_ptr(), vd.data_ptr(), [t.data_ptr() for t in state],
                    [t.data_ptr() for t in new], ld.data_ptr(), out.data_ptr(), ws.data_ptr(), stream, tactic=tactic)
        torch.cuda.synchronize()
        got = out.cpu().numpy().astype(np.float64)
        assert np.isfinite(got).all(), "NaN left in out"
        err = np.abs(got - expect)
        tol = 2e-3 + 4e-3 * np.abs(expect)
        assert (err <= tol).all(), f"S={S}: {(err > tol).sum()} of {err.size} outside tolerance, worst {err.max():.3g}"
        k_rec, v_rec, k_ring, v_ring = (t.cpu().numpy() for t in new)
        k_rec, v_rec = (f.records_to_logical(x.view(np.uint8)) for x in (k_rec, v_rec))  # stored chunk-major
        hk, hv = f.records_to_logical(host.k_rec), f.records_to_logical(host.v_rec)
        for b, L in enumerate(lengths.tolist()):
            nc = cfg.n_compressed(L)
            assert np.array_equal(k_rec[b, :, :nc], hk[b, :, :nc]), f"K records, S={S}, b={b}"
            assert np.array_equal(v_rec[b, :, :nc], hv[b, :, :nc]), f"V records, S={S}, b={b}"
            slots = [t % cfg.ring for t in range(nc, L)]
            assert np.array_equal(k_ring[b, :, slots].view(np.uint16), host.k_ring[b, :, slots].view(np.uint16))
            assert np.array_equal(v_ring[b, :, slots].view(np.uint16), host.v_ring[b, :, slots].view(np.uint16))
        state = new
    assert cfg.n_compressed(int(lengths.min())) > 0


def _gpu_forward(q, k, v, state, lengths, attrs):
    """The ONNX Runtime op's ``forward`` on the GPU: the state to the device, ``run_node``, the state back."""
    cfg, scale = f.config_from_attributes(attrs)
    B, S = q.shape[0], q.shape[2]
    st = [_dev(np.asarray(state[s], np.int8 if f.STATE_DTYPES[s] == "int8" else np.float16)) for s in f.STATE_NAMES]
    qd, kd, vd = (_dev(np.asarray(t, np.float16)) for t in (q, k, v))
    ld = _dev(np.asarray(lengths, np.int32).reshape(-1))
    tactic, nb = ks.node_plan(cfg, B)
    ws = torch.full((nb,), -85, dtype=torch.int8, device="cuda")
    out = torch.full(tuple(q.shape), float("nan"), dtype=torch.float16, device="cuda")
    ptrs = [t.data_ptr() for t in st]
    ks.run_node(cfg, scale, B, S, qd.data_ptr(), kd.data_ptr(), vd.data_ptr(), ptrs, ptrs, ld.data_ptr(),
                out.data_ptr(), ws.data_ptr(), torch.cuda.current_stream().cuda_stream, tactic=tactic)
    torch.cuda.synchronize()
    return out.cpu().numpy(), {s: t.cpu().numpy() for s, t in zip(f.STATE_NAMES, st)}


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_a_rewritten_decoder_on_the_gpu_node(sparsity, monkeypatch, tmp_path):
    """The test decoder rewritten by kv-sparsify, decoded by ``edgesdk.generate.Decoder`` with every node call run by
    the GPU kernels (the ONNX Runtime op's forward swapped for run_node) against the same model on the CPU op:
    120 tokens, window 4, group 4 (29 groups compressed), then one call of 40 tokens after a reset."""
    from pathlib import Path

    import onnx

    import edgesdk
    import edgesdk.ort.sparse_kv as op
    from edgesdk.generate import Decoder
    from edgesdk.rewrite.sparse_kv import sparsify_kv

    src = Path(__file__).resolve().parents[1] / "data" / "optimum" / "llama_d64_past" / "model.onnx"
    model, _, cfg = sparsify_kv(onnx.load(str(src)), sparsity, capacity=160, window=4, group=4)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 64, 120)]
    with edgesdk.Engine(path, backend="onnxruntime") as e:
        cpu = Decoder(e).feed(ids, chunk=1)
        cpu40 = Decoder(e).feed(ids[:40])
        monkeypatch.setattr(op, "forward", _gpu_forward)
        gpu = Decoder(e).feed(ids, chunk=1)
        gpu40 = Decoder(e).feed(ids[:40])
    scale = np.abs(cpu).max()
    print(f"sparsity {sparsity}: max |gpu - cpu| {np.abs(gpu - cpu).max():.3g} (one token per call), "
          f"{np.abs(gpu40 - cpu40).max():.3g} (40 in one call), largest |logit| {scale:.3g}")
    assert np.isfinite(gpu).all() and np.abs(gpu - cpu).max() <= 1e-2 * scale, np.abs(gpu - cpu).max()
    assert np.abs(gpu40 - cpu40).max() <= 1e-2 * scale
    assert cfg.n_compressed(120) == 116


def test_dense_prefill_state_on_the_gpu_node(monkeypatch, tmp_path):
    """Decoder(prefill=dense): the state compressed on the host from the dense model's cache (numpy
    SparseKVCache.prefill) is read by the GPU kernels as by the CPU op: 50 prompt tokens, then 30 decode steps."""
    from pathlib import Path

    import onnx

    import edgesdk
    import edgesdk.ort.sparse_kv as op
    from edgesdk.generate import Decoder
    from edgesdk.rewrite.sparse_kv import sparsify_kv

    src = Path(__file__).resolve().parents[1] / "data" / "optimum" / "llama_d64_past" / "model.onnx"
    model, _, cfg = sparsify_kv(onnx.load(str(src)), 0.7, capacity=96, window=4, group=4)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    ids = [int(t) for t in np.random.default_rng(6).integers(0, 64, 80)]
    with edgesdk.Engine(path, backend="onnxruntime") as e, edgesdk.Engine(src, backend="onnxruntime") as dense:
        runs = []
        for swap in (False, True):
            if swap:
                monkeypatch.setattr(op, "forward", _gpu_forward)
            dec = Decoder(e, prefill=dense)
            dec.prefill(ids[:50])
            runs.append(np.stack([dec.step([t])[-1] for t in ids[50:]]))
    cpu, gpu = runs
    scale = np.abs(cpu).max()
    print(f"dense prefill of 50 ({cfg.n_compressed(50)} compressed), 30 steps: max |gpu - cpu| "
          f"{np.abs(gpu - cpu).max():.3g}, largest |logit| {scale:.3g}")
    assert np.isfinite(gpu).all() and np.abs(gpu - cpu).max() <= 1e-2 * scale
