"""tierkv.weights against a real tierkvd with a weights namespace: put and
load round trips, safetensors import, list and drop, and TensorBackuper
used the way slime uses its _TensorBackuperNormal (backup, switch, restore,
get, copy)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import tierkv
import tierkv.weights as w
from conftest import WEIGHTS_TOKEN


def connect(daemon):
    return tierkv.connect(daemon.socket, namespace="weights",
                          token=WEIGHTS_TOKEN)


def megatron_like(seed: int, layers: int = 3):
    """A rank's parameters under Megatron-style names, in slime's order:
    embedding, the layers, final norm, output layer."""
    rng = np.random.default_rng(seed)
    params = {"embedding.word_embeddings.weight":
              rng.standard_normal((64, 32)).astype(np.float32)}
    for l in range(layers):
        p = f"decoder.layers.{l}."
        params[p + "self_attention.linear_qkv.weight"] = (
            rng.standard_normal((256, 1024)).astype(np.float16))  # 512 KiB
        params[p + "mlp.linear_fc1.weight"] = (
            rng.standard_normal((512, 640)).astype(np.float32))  # 1.25 MiB
        params[p + "input_layernorm.weight"] = (
            rng.standard_normal(32).astype(np.float32))
        params[p + "mlp.router.expert_bias"] = (
            rng.integers(-5, 5, 8).astype(np.int64))
    params["decoder.final_layernorm.weight"] = (
        rng.standard_normal(32).astype(np.float32))
    params["output_layer.weight"] = rng.standard_normal(
        (64, 32)).astype(np.float32)
    return params


def views(manifest, image):
    """{name: numpy view} of a loaded image, by the manifest."""
    out = {}
    for t in manifest["tensors"]:
        raw = image[t["offset"]:t["offset"] + t["bytes"]]
        out[t["name"]] = raw.view(w._ST_TO_NUMPY[t["dtype"]]).reshape(
            t["shape"])
    return out


def test_layer_groups_follow_layer_numbers_like_import():
    names = ["embed", "model.layers.4.a", "model.layers.4.b", "lm_head",
             "model.layers.7.a", "norm"]
    assert w.layer_groups(names) == [0, 0, 0, 1, 1, 1]
    assert w.layer_of("decoder.layers.12.mlp") == 12
    assert w.layer_of("sublayers.3.x") is None


def test_put_then_load_is_bit_exact_layer_by_layer(weights_daemon):
    params = megatron_like(1)
    with connect(weights_daemon) as c:
        stored = w.put(c, "actor", "test/rank0-of-1", params.items())
        assert stored.num_layers == 3
        assert stored.tensors == len(params)
        assert stored.chunks_stored == stored.chunks
        m = w.manifest(c, "actor", "test/rank0-of-1")
        assert m["version"] == stored.version
        # Embeddings go with layer 0, the final norm and head with the last.
        layer = {t["name"]: t["layer"] for t in m["tensors"]}
        assert layer["embedding.word_embeddings.weight"] == 0
        assert layer["output_layer.weight"] == 2
        with w.load(c, "actor", "test/rank0-of-1") as ld:
            # The version the load resolved "newest" to, and its manifest:
            # the offsets to read tensors at.
            assert ld.version == stored.version
            assert ld.manifest == m
            for l in range(3):
                ld.wait_layer(l)
                assert ld.layers_done() >= l + 1
            ld.wait()
            got = views(ld.manifest, ld.image)
        for name, value in params.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)

        # The same tensors again are the same version, and copy nothing.
        again = w.put(c, "actor", "test/rank0-of-1", params.items())
        assert again.version == stored.version
        assert again.chunks_stored == 0
        assert again.chunks_deduplicated == stored.chunks


def test_load_to_pool_lets_the_daemon_fill_the_image(weights_daemon):
    params = megatron_like(2)
    with connect(weights_daemon) as c:
        stored = w.put(c, "actor", "test/pool", params.items())
        m = w.manifest(c, "actor", "test/pool")
        pool = w.image_pool(c, m["image_bytes"] + 4096)
        pool.array[:] = 0xEE
        try:
            with w.load_to_pool(c, "actor", "test/pool", pool) as ld:
                assert ld.version == stored.version
                for l in range(3):
                    ld.wait_layer(l)
                    assert ld.layers_done() >= l + 1
                got = views(ld.manifest, ld.image)
                for name, value in params.items():
                    np.testing.assert_array_equal(got[name], value,
                                                  err_msg=name)
                # Nothing past the image was written.
                assert (ld.image[m["image_bytes"]:] == 0xEE).all()
            stats = c.stats()
            assert stats["transfers"]["load_segments"]["host"] == len(
                m["chunks"])
            # One image pool per connection; a pool too small is refused.
            with pytest.raises(tierkv.InvalidArgumentError):
                w.image_pool(c, 4096)
        finally:
            pool.close()
        with connect(weights_daemon) as c2:
            small = w.image_pool(c2, 4096)
            try:
                with pytest.raises(tierkv.InvalidArgumentError):
                    w.load_to_pool(c2, "actor", "test/pool", small)
            finally:
                small.close()


def test_put_from_pool_stages_an_engines_image(weights_daemon):
    params = megatron_like(3)
    m = w.plan("critic", "test/pool-put", params.items())
    assert all(c["key"] == "0" * 32 for c in m["chunks"])
    with connect(weights_daemon) as c:
        pool = w.image_pool(c, m["image_bytes"])
        try:
            # The engine lays its tensors out as planned.
            for t in m["tensors"]:
                raw = params[t["name"]].reshape(-1).view(np.uint8)
                pool.array[0, t["offset"]:t["offset"] + t["bytes"]] = raw
            staged = w.put_from_pool(c, "critic", "test/pool-put",
                                     params.items())
            assert staged.chunks_stored == staged.chunks
            # The same bytes put from host memory: the same version, and
            # nothing copied again.
            again = w.put(c, "critic", "test/pool-put", params.items())
            assert again.version == staged.version
            assert again.chunks_stored == 0
            with w.load(c, "critic", "test/pool-put") as ld:
                ld.wait()
                got = views(ld.manifest, ld.image)
            for name, value in params.items():
                np.testing.assert_array_equal(got[name], value, err_msg=name)
        finally:
            pool.close()


def test_list_and_drop(weights_daemon):
    with connect(weights_daemon) as c:
        a = w.put(c, "m", "rank0", megatron_like(2).items())
        w.put(c, "m", "rank1", megatron_like(3).items())
        shards = w.list_weights(c, "m")
        assert sorted(s["layout"] for s in shards) == ["rank0", "rank1"]
        rank0 = next(s for s in shards if s["layout"] == "rank0")
        assert rank0["version"] == a.version
        assert rank0["num_layers"] == 3 and rank0["chunks_missing"] == 0
        assert w.drop(c, "m", "rank0")[0] == 1
        with pytest.raises(tierkv.NotFoundError):
            w.manifest(c, "m", "rank0")
        dropped, freed = w.drop(c, "m")
        assert dropped == 1 and freed > 0
        assert w.list_weights(c) == []
        with pytest.raises(tierkv.NotFoundError):
            w.drop(c, "m")
        with pytest.raises(tierkv.NotFoundError):
            w.load(c, "m", "rank0")


def test_hint_and_pin_reach_the_daemons_schedule(weights_daemon):
    with connect(weights_daemon) as c:
        a = w.put(c, "h", "rank0", megatron_like(4).items())
        w.put(c, "h", "rank1", megatron_like(5).items())

        def schedule():
            return c.stats()["weights"]

        w.hint(c, [w.Hint("h", "rank0", next_use_s=30, version=a.version),
                   w.Hint("h", "rank1", next_use_s=0.5)])
        assert schedule()["hinted_shards"] == 2
        w.hint(c, [w.Hint("h", "rank1", next_use_s=None)])
        assert schedule()["hinted_shards"] == 1
        with pytest.raises(tierkv.NotFoundError, match="hint 0"):
            w.hint(c, [w.Hint("nope", "rank0", next_use_s=1)])
        w.hint(c, [])  # nothing to say: fine

        w.pin(c, "h", "rank0", ttl_s=600)
        pinned = schedule()
        assert pinned["pinned_shards"] == 1
        # Its distinct chunks: every one was stored by this put.
        assert a.chunks_deduplicated == 0
        assert pinned["pinned_bytes"] == a.bytes_stored
        w.unpin(c, "h", "rank0")
        assert schedule()["pinned_shards"] == 0
        with pytest.raises(tierkv.InvalidArgumentError):
            w.pin(c, "h", "rank0", ttl_s=-1)
        with pytest.raises(tierkv.NotFoundError):
            w.pin(c, "h", "rank9", ttl_s=1)

        # TensorBackuper's hint names the tag's current version.
        params = megatron_like(6)
        backuper = w.TensorBackuper.create(lambda: params.items(), client=c,
                                           layout="tp0", model_prefix="t-")
        backuper.backup("teacher")
        backuper.hint("teacher", 10)
        assert schedule()["hinted_shards"] == 2
        with pytest.raises(KeyError):
            backuper.hint("never", 1)
        # Out of range: refused before the daemon sees it.
        with pytest.raises(tierkv.InvalidArgumentError):
            w.hint(c, [w.Hint("h", "rank0", next_use_s=-1)])
        with pytest.raises(tierkv.InvalidArgumentError):
            w.pin(c, "h", "rank0", ttl_s=1e300)
        # A tiny ttl is a pin (at least 1 ms), not an unpin.
        assert w._millis(0.0001) == 1 and w._millis(0) == 0


def write_safetensors(path, tensors):
    """A minimal safetensors writer (the format's spec), independent of the
    C++ one, so the import is checked against a file tierkv did not
    write."""
    header, offset, blobs = {}, 0, []
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
    for name, a in tensors:
        data = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_import_safetensors_then_load(weights_daemon, tmp_path):
    rng = np.random.default_rng(4)
    tensors = [
        ("model.embed_tokens.weight", rng.standard_normal((32, 16),
                                                          np.float32)),
        ("model.layers.0.mlp.weight",
         rng.standard_normal((600, 600)).astype(np.float32)),
        ("model.layers.1.mlp.weight",
         rng.standard_normal((8, 8)).astype(np.float16)),
        ("model.norm.weight", rng.standard_normal(16, np.float32)),
    ]
    path = tmp_path / "model.safetensors"
    write_safetensors(path, tensors)
    with connect(weights_daemon) as c:
        stored = w.import_safetensors(c, "hf-tiny", "hf/mixed/rank0-of-1",
                                      path)
        assert stored.tensors == 4 and stored.num_layers == 2
        m = w.manifest(c, "hf-tiny", "hf/mixed/rank0-of-1", stored.version)
        with w.load(c, "hf-tiny", "hf/mixed/rank0-of-1",
                    version=stored.version) as ld:
            ld.wait()
            got = views(m, ld.image)
        for name, value in tensors:
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_tensor_backuper_switches_models_like_slime(weights_daemon):
    # The live "GPU" parameters: updated in place, as Megatron's are.
    live = megatron_like(10)

    def source_getter():
        return iter(live.items())

    actor = {k: v.copy() for k, v in live.items()}
    with connect(weights_daemon) as c:
        backuper = w.TensorBackuper.create(source_getter, None, client=c,
                                           layout="slime/tp0-pp0-of-1")
        backuper.backup("actor")
        # A teacher of the same architecture, loaded into the live model and
        # backed up; it shares the embedding with the actor.
        teacher = megatron_like(11)
        teacher["embedding.word_embeddings.weight"] = actor[
            "embedding.word_embeddings.weight"].copy()
        for k in live:
            np.copyto(live[k], teacher[k])
        backuper.backup("teacher")
        assert backuper.backup_tags == ["actor", "teacher"]

        backuper.restore("actor")
        for k in live:
            np.testing.assert_array_equal(live[k], actor[k], err_msg=k)
        backuper.restore("teacher")
        for k in live:
            np.testing.assert_array_equal(live[k], teacher[k], err_msg=k)

        got = backuper.get("actor")
        assert set(got) == set(actor)
        for k in actor:
            np.testing.assert_array_equal(got[k], actor[k], err_msg=k)
        assert backuper.get("never") == {}

        # A training step changes one tensor; backing up again keeps one
        # version per tag (the old one is dropped).
        live["decoder.layers.1.input_layernorm.weight"] += 1
        backuper.backup("teacher")
        assert len(w.list_weights(c, "teacher")) == 1

        # copy: the teacher takes the actor's values.
        backuper.copy(src_tag="actor", dst_tag="teacher")
        backuper.restore("teacher")
        for k in live:
            np.testing.assert_array_equal(live[k], actor[k], err_msg=k)

        with pytest.raises(AssertionError):
            backuper.restore("ref")
        live["decoder.layers.9.extra"] = np.zeros(4, np.float32)
        with pytest.raises(AssertionError):
            backuper.restore("actor")


def test_load_refuses_a_small_or_readonly_image(weights_daemon):
    with connect(weights_daemon) as c:
        stored = w.put(c, "m", "l", megatron_like(5).items())
        with pytest.raises(tierkv.InvalidArgumentError):
            w.load(c, "m", "l", np.empty(stored.image_bytes - 1, np.uint8))
        image = np.empty(stored.image_bytes, np.uint8)
        image.flags.writeable = False
        with pytest.raises(tierkv.InvalidArgumentError):
            w.load(c, "m", "l", image)


def test_tensor_backuper_with_torch_parameters(weights_daemon):
    # Skipped where torch is absent (Debian's python3 has none; the engine
    # virtualenvs do): bf16 has no numpy dtype, so this is the torch path.
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    live = {
        "embedding.weight": torch.nn.Parameter(
            torch.randn(64, 16, generator=gen).to(torch.bfloat16)),
        "decoder.layers.0.linear.weight": torch.nn.Parameter(
            torch.randn(1024, 600, generator=gen).to(torch.bfloat16)),
        "decoder.layers.1.linear.weight": torch.nn.Parameter(
            torch.randn(8, 8, generator=gen)),
    }
    actor = {k: v.detach().clone() for k, v in live.items()}
    with connect(weights_daemon) as c:
        backuper = w.TensorBackuper.create(lambda: iter(live.items()), None,
                                           client=c, layout="torch/rank0")
        backuper.backup("actor")
        with torch.no_grad():
            for v in live.values():
                v.add_(1)
        backuper.restore("actor")
        for k, v in live.items():
            assert torch.equal(v.detach(), actor[k]), k
        got = backuper.get("actor")
        assert got["embedding.weight"].dtype == torch.bfloat16
        assert torch.equal(got["embedding.weight"], actor["embedding.weight"])
