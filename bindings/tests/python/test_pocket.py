"""The Python bindings against the real library: load, info, streaming,
listener stop, cancellation from another thread, errors, chat, loadFromFd,
split models (loadParts, loadPartsFromFds)."""

import os
import struct
import threading
import time

import pytest

import pocket

GREEDY = dict(temperature=0.0)


class Collect(pocket.TokenListener):
    """Collects pieces; stops after `limit` of them when given."""

    def __init__(self, limit=None, on_piece=None):
        self.pieces = []
        self.limit = limit
        self.on_piece = on_piece

    def on_token(self, piece):
        self.pieces.append(piece)
        if self.on_piece:
            self.on_piece(piece)
        return self.limit is None or len(self.pieces) < self.limit

    @property
    def text(self):
        return "".join(self.pieces)


def gguf_bytes(arch: str) -> bytes:
    """A GGUF v3 header with one metadata key (general.architecture) and no tensors."""

    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    GGUF_TYPE_STRING = 8
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("general.architecture") + struct.pack("<I", GGUF_TYPE_STRING) + string(arch)


# ---- load and info ---------------------------------------------------------------


def test_info_of_a_moe_model(moe, moe_path):
    info = moe.info()
    assert info.architecture == "qwen3moe"
    assert info.expert_count == 8 and info.expert_used_count == 2
    assert info.quantization == "Q4_K_M"
    assert info.file_bytes == os.path.getsize(moe_path)
    assert info.parameter_count > 1_000_000
    assert info.context_length > 0
    assert isinstance(info.name, str) and isinstance(info.has_chat_template, bool)
    assert info.backend == pocket.Backend.CPU and info.adapter is None


def test_backend_auto_is_the_cpu_and_gpu_names_its_adapter_or_is_unsupported(moe_path):
    for backend in (pocket.Backend.AUTO, pocket.Backend.CPU):
        info = pocket.PocketModel.load(moe_path, pocket.LoadOptions(backend=backend)).info()
        assert info.backend == pocket.Backend.CPU and info.adapter is None
    try:
        info = pocket.PocketModel.load(moe_path, pocket.LoadOptions(backend=pocket.Backend.GPU)).info()
        assert info.adapter.kernels in ("f16+subgroups", "f16", "subgroups", "portable")
        assert info.backend == pocket.Backend.GPU and info.adapter.name
    except pocket.PocketError.UnsupportedModel as e:
        assert "GPU unavailable" in e.reason


def test_info_of_a_dense_model(gemma_tiny):
    info = gemma_tiny.info()
    assert info.architecture == "gemma3"
    assert info.expert_count == 0 and info.expert_used_count == 0


def test_load_options_defaults():
    o = pocket.LoadOptions()
    assert (o.threads, o.use_mmap, o.progress, o.memory_budget_bytes, o.backend) == (0, True, None, 0, None)
    s = pocket.SessionOptions()
    assert (s.context_length, s.kv_cache_type, s.sliding_window, s.threads) == (0, None, False, 0)
    g = pocket.GenerateOptions()
    assert g.max_tokens == 256 and g.stop == [] and g.seed is None
    assert g.top_k == 40 and g.repeat_penalty == 1.0


def test_read_into_memory_reports_progress(moe_path, moe):
    seen = []

    class Progress(pocket.LoadProgressListener):
        def on_progress(self, fraction):
            seen.append(fraction)

    m = pocket.PocketModel.load(moe_path, pocket.LoadOptions(use_mmap=False, progress=Progress()))
    assert m.info() == moe.info()
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)


def test_a_failing_progress_listener_does_not_fail_the_load(moe_path):
    class Broken(pocket.LoadProgressListener):
        def on_progress(self, fraction):
            raise RuntimeError("progress bar fell over")

    assert pocket.PocketModel.load(moe_path, pocket.LoadOptions(progress=Broken())).info().architecture == "qwen3moe"


# ---- loadFromFd -------------------------------------------------------------------


def test_load_from_fd_whole_file(moe_path, moe):
    fd = os.open(moe_path, os.O_RDONLY)
    try:
        m = pocket.PocketModel.load_from_fd(fd, 0, os.path.getsize(moe_path), pocket.LoadOptions())
    finally:
        os.close(fd)
    # The descriptor was duplicated: the model outlives the caller's close.
    assert m.info() == moe.info()
    s = pocket.PocketSession(m, pocket.SessionOptions())
    assert s.generate("Hello", pocket.GenerateOptions(max_tokens=4, **GREEDY), Collect()).generated_tokens == 4


@pytest.mark.parametrize("use_mmap", [True, False])
def test_load_from_fd_at_an_offset_like_an_apk_asset(tmp_path, moe_path, moe, use_mmap):
    data = open(moe_path, "rb").read()
    prefix = b"PK\x03\x04" + b"\0" * 4109  # an unaligned offset, as inside a zip
    apk = tmp_path / "app.apk"
    apk.write_bytes(prefix + data + b"trailing entries")
    with open(apk, "rb") as f:
        m = pocket.PocketModel.load_from_fd(f.fileno(), len(prefix), len(data), pocket.LoadOptions(use_mmap=use_mmap))
    assert m.info() == moe.info()


def test_load_from_fd_rejects_bad_ranges_and_descriptors(moe_path):
    size = os.path.getsize(moe_path)
    with open(moe_path, "rb") as f:
        with pytest.raises(pocket.PocketError.InvalidArgument):
            pocket.PocketModel.load_from_fd(f.fileno(), 16, size, pocket.LoadOptions())
    with pytest.raises(pocket.PocketError.InvalidArgument):
        pocket.PocketModel.load_from_fd(-1, 0, size, pocket.LoadOptions())


# ---- split models (llama-gguf-split shards) ---------------------------------------


def split_gguf(path, prefix, n):
    """Split a GGUF file into n shards `PREFIX-0000k-of-0000N.gguf` as llama-gguf-split
    lays them out (metadata in the first; split.no, split.count, split.tensors.count in
    each). Returns the shards' paths."""
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n_bytes = take("<Q")
        pos += n_bytes
        return data[pos - n_bytes : pos]

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(t):
        nonlocal pos
        if t == 8:
            string()
        elif t == 9:
            et, count = take("<I"), take("<Q")
            for _ in range(count):
                skip_value(et)
        else:
            pos += sizes[t]

    assert take("<4s") == b"GGUF"
    _version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    kvs = []
    for _ in range(n_kv):
        start = pos
        key = string()
        skip_value(take("<I"))
        kvs.append(data[start:pos])
        assert not key.startswith(b"split.")
    infos = []
    for _ in range(n_tensors):
        start = pos
        string()
        n_dims = take("<I")
        pos += 8 * n_dims + 4
        infos.append((data[start:pos], take("<Q")))
    align = 32
    data_start = (pos + align - 1) // align * align
    ends = sorted(o for _, o in infos)[1:] + [len(data) - data_start]
    span = dict(zip(sorted(o for _, o in infos), ends))
    per = (len(infos) + n - 1) // n
    paths = []
    for k in range(n):
        mine = infos[k * per : (k + 1) * per]
        keys = [
            string_bytes("split.no") + struct.pack("<IH", 2, k),
            string_bytes("split.count") + struct.pack("<IH", 2, n),
            string_bytes("split.tensors.count") + struct.pack("<Ii", 5, len(infos)),
        ]
        head_kvs = (kvs if k == 0 else []) + keys
        head = b"GGUF" + struct.pack("<IQQ", 3, len(mine), len(head_kvs)) + b"".join(head_kvs)
        body, offset = b"", 0
        for info, o in mine:
            chunk = data[data_start + o : data_start + span[o]]
            chunk += b"\0" * (-len(chunk) % align)
            head += info + struct.pack("<Q", offset)
            body += chunk
            offset += len(chunk)
        head += b"\0" * (-len(head) % align)
        p = f"{prefix}-{k + 1:05d}-of-{n:05d}.gguf"
        with open(p, "wb") as f:
            f.write(head + body)
        paths.append(p)
    return paths


def string_bytes(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def test_a_split_model_loads_from_its_first_shard_a_list_or_descriptors(tmp_path, moe_path, moe):
    shards = split_gguf(moe_path, str(tmp_path / "moe"), 3)
    opts = pocket.GenerateOptions(max_tokens=8, **GREEDY)
    want = pocket.PocketSession(moe, pocket.SessionOptions()).generate("Once upon a time", opts, Collect()).text
    first = pocket.PocketModel.load(shards[0], pocket.LoadOptions())
    info = first.info()
    assert info.file_bytes == sum(os.path.getsize(p) for p in shards)
    assert info.parameter_count == moe.info().parameter_count and info.expert_count == 8
    models = [
        first,
        pocket.PocketModel.load(shards[0], pocket.LoadOptions(use_mmap=False)),
        pocket.PocketModel.load_parts(list(reversed(shards)), pocket.LoadOptions()),
        pocket.PocketModel.load_parts([shards[1], shards[0], shards[2]], pocket.LoadOptions(use_mmap=False)),
    ]
    # Descriptor ranges, each shard inside a file of its own at an unaligned offset (asset packs).
    files, parts = [], []
    for i, s in enumerate(shards):
        body = open(s, "rb").read()
        pack = tmp_path / f"pack{i}.apk"
        pack.write_bytes(b"PK" + b"\0" * (4099 + i) + body + b"more")
        f = open(pack, "rb")
        files.append(f)
        parts.append(pocket.FilePart(fd=f.fileno(), offset=4101 + i, length=len(body)))
    for use_mmap in (True, False):
        models.append(pocket.PocketModel.load_parts_from_fds(list(reversed(parts)), pocket.LoadOptions(use_mmap=use_mmap)))
    for f in files:
        f.close()  # the descriptors were duplicated
    plan = first.memory_plan(0)
    models.append(pocket.PocketModel.load(shards[0], pocket.LoadOptions(memory_budget_bytes=plan.minimum_budget_bytes)))
    assert pocket.plan_memory(shards[0], 0) == plan and plan.file_bytes == info.file_bytes
    for m in models:
        assert m.info() == info
        assert pocket.PocketSession(m, pocket.SessionOptions()).generate("Once upon a time", opts, Collect()).text == want


def test_a_wrong_set_of_shards_names_the_shard(tmp_path, moe_path):
    shards = split_gguf(moe_path, str(tmp_path / "moe"), 3)
    with pytest.raises(pocket.PocketError.InvalidModel) as e:
        pocket.PocketModel.load_parts([shards[0], shards[1], shards[1], shards[2]], pocket.LoadOptions())
    assert "duplicated" in e.value.reason and "moe-00002-of-00003.gguf" in e.value.reason
    with pytest.raises(pocket.PocketError.InvalidModel) as e:
        pocket.PocketModel.load(shards[1], pocket.LoadOptions())
    assert "first shard" in e.value.reason
    data = open(shards[2], "rb").read()
    open(shards[2], "wb").write(data[:-64])
    with pytest.raises(pocket.PocketError.InvalidModel) as e:
        pocket.PocketModel.load(shards[0], pocket.LoadOptions())
    assert "moe-00003-of-00003.gguf" in e.value.reason and "outside" in e.value.reason
    os.remove(shards[2])
    for load in (
        lambda: pocket.PocketModel.load(shards[0], pocket.LoadOptions()),
        lambda: pocket.PocketModel.load_parts(shards[:2], pocket.LoadOptions()),
    ):
        with pytest.raises(pocket.PocketError.Io) as e:
            load()
        assert "missing" in e.value.reason and "moe-00003-of-00003.gguf" in e.value.reason


# ---- errors -----------------------------------------------------------------------


def test_bad_files_raise_pocket_errors(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model" * 10)
    with pytest.raises(pocket.PocketError.InvalidModel) as e:
        pocket.PocketModel.load(str(junk), pocket.LoadOptions())
    assert "GGUF" in e.value.reason

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(gguf_bytes("qwen3moe")[:30])
    with pytest.raises(pocket.PocketError.InvalidModel):
        pocket.PocketModel.load(str(truncated), pocket.LoadOptions())

    with pytest.raises(pocket.PocketError.Io):
        pocket.PocketModel.load(str(tmp_path / "missing.gguf"), pocket.LoadOptions())

    mamba = tmp_path / "mamba.gguf"
    mamba.write_bytes(gguf_bytes("mamba"))
    with pytest.raises(pocket.PocketError.UnsupportedModel) as e:
        pocket.PocketModel.load(str(mamba), pocket.LoadOptions())
    assert "mamba" in e.value.reason
    # Every variant is a PocketError carrying a reason.
    assert isinstance(e.value, pocket.PocketError)


def test_invalid_options_raise_invalid_argument(session):
    # Core validates every request (the CLI refuses the same values): the
    # error names the setting, and nothing is generated.
    bad = [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(min_p=2.0), "min_p"),
        (dict(repeat_penalty=0.0), "repeat_penalty"),
    ]
    for opts, field in bad:
        with pytest.raises(pocket.PocketError.InvalidArgument) as e:
            session.generate("Hi", pocket.GenerateOptions(**opts), Collect())
        assert field in e.value.reason, (opts, e.value.reason)
    # The session is unharmed.
    stats = session.generate("Hi", pocket.GenerateOptions(max_tokens=2, **GREEDY), Collect())
    assert stats.generated_tokens == 2


def test_context_full_and_the_sliding_window(moe):
    small = pocket.PocketSession(moe, pocket.SessionOptions(context_length=32))
    with pytest.raises(pocket.PocketError.ContextFull):
        small.generate("one two three " * 20, pocket.GenerateOptions(max_tokens=4), Collect())
    with pytest.raises(pocket.PocketError.ContextFull):
        small.generate("Hello", pocket.GenerateOptions(max_tokens=64, **GREEDY), Collect())
    sliding = pocket.PocketSession(moe, pocket.SessionOptions(context_length=32, sliding_window=True))
    stats = sliding.generate("Hello", pocket.GenerateOptions(max_tokens=64, **GREEDY), Collect())
    assert stats.generated_tokens == 64 or stats.stop_reason == pocket.StopReason.END_OF_TEXT


def test_generation_after_errors_still_works(session, tmp_path):
    opts = pocket.GenerateOptions(max_tokens=6, **GREEDY)
    first = session.generate("Hello world", opts, Collect())
    with pytest.raises(pocket.PocketError):
        pocket.PocketModel.load(str(tmp_path / "nope.gguf"), pocket.LoadOptions())
    with pytest.raises(pocket.PocketError.InvalidArgument):
        session.chat([pocket.ChatMessage(role="robot", content="beep")], opts, Collect())

    class Throws(pocket.TokenListener):
        def on_token(self, piece):
            raise ValueError("listener bug")

    with pytest.raises(pocket.PocketError.Internal) as e:
        session.generate("Hello world", opts, Throws())
    assert "listener bug" in e.value.reason
    again = session.generate("Hello world", opts, Collect())
    assert again.text == first.text and again.generated_tokens == 6


# ---- streaming ----------------------------------------------------------------------


def test_streaming_pieces_and_stats(session):
    listener = Collect()
    stats = session.generate("The quick brown fox", pocket.GenerateOptions(max_tokens=12, **GREEDY), listener)
    assert stats.stop_reason in (pocket.StopReason.MAX_TOKENS, pocket.StopReason.END_OF_TEXT)
    assert 0 < stats.generated_tokens <= 12
    assert stats.prompt_tokens >= 4
    assert listener.text == stats.text and len(listener.pieces) > 0
    assert stats.time_to_first_token_ms > 0
    assert stats.prefill_tokens_per_second > 0 and stats.decode_tokens_per_second > 0


def test_a_memory_budget_gives_the_same_text_and_counts_expert_reads(moe_path, moe):
    plan = pocket.plan_memory(moe_path, 0)
    assert plan.expert_bytes > 0 and plan.resident_bytes > 0 and plan.cache_bytes == 0
    assert plan.minimum_budget_bytes > plan.resident_bytes
    assert moe.memory_plan(0) == plan
    with pytest.raises(pocket.PocketError.OutOfMemory) as e:
        pocket.PocketModel.load(moe_path, pocket.LoadOptions(memory_budget_bytes=plan.minimum_budget_bytes - 1))
    assert str(plan.minimum_budget_bytes) in e.value.reason
    budget = plan.minimum_budget_bytes
    assert pocket.plan_memory(moe_path, budget).cache_bytes > 0
    small = pocket.PocketModel.load(moe_path, pocket.LoadOptions(memory_budget_bytes=budget))
    assert small.memory_budget_bytes() == budget
    opts = pocket.GenerateOptions(max_tokens=12, **GREEDY)
    want = pocket.PocketSession(moe, pocket.SessionOptions()).generate("Once upon a time", opts, Collect())
    got = pocket.PocketSession(small, pocket.SessionOptions()).generate("Once upon a time", opts, Collect())
    assert got.text == want.text
    assert got.expert_cache_misses > 0 and got.storage_bytes_read > 0
    assert (want.expert_cache_hits, want.expert_cache_misses, want.storage_bytes_read) == (0, 0, 0)


def test_set_memory_budget_mid_answer_from_another_thread_keeps_the_text(moe_path, moe):
    plan = pocket.plan_memory(moe_path, 0)
    minimum = plan.minimum_budget_bytes
    half = minimum + plan.expert_bytes // 2
    opts = pocket.GenerateOptions(max_tokens=32, **GREEDY)
    reference = Collect()
    want = pocket.PocketSession(moe, pocket.SessionOptions()).generate("Once upon a time", opts, reference)
    n = len(reference.pieces)
    assert n >= 8, reference.pieces

    model = pocket.PocketModel.load(moe_path, pocket.LoadOptions())
    assert model.memory_budget_bytes() == 0
    # After these pieces, the main thread sets these budgets while the
    # generating thread waits: from none, shrink, to the mapping, from none.
    changes = [(1, half), (n // 4, minimum), (n // 2, 0), (3 * n // 4, minimum + plan.expert_bytes)]
    due = [threading.Event() for _ in changes]
    applied = [threading.Event() for _ in changes]
    pieces = []

    def on_piece(piece):
        pieces.append(piece)
        for (k, _), d, a in zip(changes, due, applied):
            if len(pieces) == k:
                d.set()
                assert a.wait(30)

    result = {}

    def generate():
        session = pocket.PocketSession(model, pocket.SessionOptions())
        result["stats"] = session.generate("Once upon a time", opts, Collect(on_piece=on_piece))

    worker = threading.Thread(target=generate)
    worker.start()
    seen = []
    for (k, budget), d, a in zip(changes, due, applied):
        assert d.wait(30), f"the answer ended before piece {k}"
        before = model.memory_usage()
        model.set_memory_budget(budget)
        seen.append((budget, before, model.memory_usage(), model.memory_budget_bytes()))
        a.set()
    worker.join(60)
    assert not worker.is_alive()
    got = result["stats"]
    assert got.text == want.text and got.generated_tokens == want.generated_tokens
    assert got.expert_cache_misses > 0  # some tokens ran under a budget

    for budget, before, after, reported in seen:
        assert reported == budget
        assert after.kv_cache_bytes > 0 and after.scratch_bytes > 0
        if budget == 0:
            assert after.expert_cache_bytes == 0
        else:
            assert after.resident_weights_bytes == plan.resident_bytes
            assert after.expert_cache_bytes <= model.memory_plan(budget).cache_bytes
    # The shrink gave memory back at once.
    assert seen[1][2].expert_cache_bytes < seen[1][1].expert_cache_bytes


def test_set_memory_budget_below_the_minimum_is_refused_and_changes_nothing(moe_path):
    plan = pocket.plan_memory(moe_path, 0)
    model = pocket.PocketModel.load(moe_path, pocket.LoadOptions(memory_budget_bytes=plan.minimum_budget_bytes))
    before = model.memory_usage()
    with pytest.raises(pocket.PocketError.InvalidArgument) as e:
        model.set_memory_budget(plan.minimum_budget_bytes - 1)
    assert str(plan.minimum_budget_bytes) in e.value.reason
    assert model.memory_budget_bytes() == plan.minimum_budget_bytes
    assert model.memory_usage() == before
    model.set_memory_budget(0)
    assert model.memory_budget_bytes() == 0 and model.memory_usage().expert_cache_bytes == 0


def test_greedy_is_deterministic_across_sessions(moe):
    opts = pocket.GenerateOptions(max_tokens=10, **GREEDY)
    a = pocket.PocketSession(moe, pocket.SessionOptions()).generate("Once upon a time", opts, Collect())
    b = pocket.PocketSession(moe, pocket.SessionOptions(kv_cache_type=pocket.KvCacheType.F32))
    assert b.generate("Once upon a time", opts, Collect()).text == a.text


def test_seeded_sampling_repeats(moe):
    opts = pocket.GenerateOptions(max_tokens=10, temperature=1.0, seed=7)
    texts = {pocket.PocketSession(moe, pocket.SessionOptions()).generate("Hi", opts, Collect()).text for _ in range(2)}
    assert len(texts) == 1


def test_listener_stop(session):
    listener = Collect(limit=3)
    stats = session.generate("Hello", pocket.GenerateOptions(max_tokens=50, **GREEDY), listener)
    assert stats.stop_reason == pocket.StopReason.LISTENER_STOPPED
    assert len(listener.pieces) == 3


def test_stop_strings(moe):
    opts = pocket.GenerateOptions(max_tokens=24, **GREEDY)
    full = pocket.PocketSession(moe, pocket.SessionOptions()).generate("Tell me", opts, Collect()).text
    stop = full[len(full) // 2 :][:3]
    cut = full.index(stop)
    opts.stop = [stop]
    listener = Collect()
    stats = pocket.PocketSession(moe, pocket.SessionOptions()).generate("Tell me", opts, listener)
    assert stats.stop_reason == pocket.StopReason.STOP_STRING
    assert listener.text == full[:cut] == stats.text


def test_cancel_from_another_thread(moe):
    session = pocket.PocketSession(moe, pocket.SessionOptions())
    started = threading.Event()
    listener = Collect(on_piece=lambda _: (started.set(), time.sleep(0.005)))
    result = {}

    def run():
        result["stats"] = session.generate("Hello", pocket.GenerateOptions(max_tokens=3000, temperature=1.0), listener)

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(30)
    session.cancel()
    worker.join(30)
    assert not worker.is_alive()
    assert result["stats"].stop_reason == pocket.StopReason.CANCELLED
    assert result["stats"].generated_tokens < 3000


def test_a_cancel_before_a_request_does_not_stick(session):
    session.cancel()
    stats = session.generate("Hello", pocket.GenerateOptions(max_tokens=5, **GREEDY), Collect())
    assert stats.stop_reason != pocket.StopReason.CANCELLED


def test_concurrent_requests_on_one_session_take_turns(moe):
    session = pocket.PocketSession(moe, pocket.SessionOptions())
    opts = pocket.GenerateOptions(max_tokens=8, **GREEDY)
    expected = session.generate("Hello", opts, Collect()).text
    results, errors = [], []

    def run():
        try:
            results.append(session.generate("Hello", opts, Collect()).text)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and results == [expected] * 3


def test_generate_from_inside_the_listener_is_refused(session):
    inner = {}

    class Reenter(pocket.TokenListener):
        def on_token(self, piece):
            try:
                session.generate("again", pocket.GenerateOptions(max_tokens=2), Collect())
            except pocket.PocketError as e:
                inner["error"] = e
            return False

    stats = session.generate("Hello", pocket.GenerateOptions(max_tokens=5), Reenter())
    assert stats.stop_reason == pocket.StopReason.LISTENER_STOPPED
    assert isinstance(inner["error"], pocket.PocketError.InvalidArgument)


# ---- chat -------------------------------------------------------------------------------


def test_chat_turns(moe):
    session = pocket.PocketSession(moe, pocket.SessionOptions())
    opts = pocket.GenerateOptions(max_tokens=8, **GREEDY)
    history = [pocket.ChatMessage(role="system", content="Be brief."), pocket.ChatMessage(role="user", content="Hi!")]
    first = session.chat(history, opts, Collect())
    assert first.generated_tokens > 0 and first.prompt_tokens > 5
    history += [pocket.ChatMessage(role="assistant", content=first.text), pocket.ChatMessage(role="user", content="More?")]
    second = session.chat(history, opts, Collect())
    assert second.prompt_tokens > first.prompt_tokens
    session.reset()
    assert session.chat(history, opts, Collect()).text == second.text


def test_chat_needs_messages(session):
    with pytest.raises(pocket.PocketError.InvalidArgument):
        session.chat([], pocket.GenerateOptions(), Collect())


# ---- the real model ---------------------------------------------------------------------------


@pytest.mark.skipif(not os.environ.get("POCKET_GEMMA"), reason="POCKET_GEMMA (Gemma 3 270M) not set")
def test_gemma_270m_greedy_matches_llama_cpp():
    model = pocket.PocketModel.load(os.environ["POCKET_GEMMA"], pocket.LoadOptions())
    info = model.info()
    assert info.architecture == "gemma3" and info.parameter_count > 200_000_000
    session = pocket.PocketSession(model, pocket.SessionOptions(context_length=512))
    listener = Collect()
    stats = session.generate("The capital of France is", pocket.GenerateOptions(max_tokens=16, **GREEDY), listener)
    # llama.cpp: " the capital of the country of France. It is the largest city in France."
    # Its 12th token is a near-tie (0.03-0.15 logits between "capital" and "largest")
    # that other float summation orders resolve either way (Pocket's scalar path and
    # its tiled prompt attention pick "capital"), as the CLI's test says; the text
    # before it is fixed.
    assert listener.text.startswith(" the capital of the country of France. It is the "), listener.text
    assert stats.generated_tokens == 16 and stats.prompt_tokens == 6
    answer = session.chat([pocket.ChatMessage(role="user", content="Say hello.")], pocket.GenerateOptions(max_tokens=24, **GREEDY), Collect())
    assert answer.generated_tokens > 0 and answer.text.strip()


# ---- snapshots -------------------------------------------------------------------


RESTORE_IN_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import pocket

class Collect(pocket.TokenListener):
    def __init__(self):
        self.pieces = []
    def on_token(self, piece):
        self.pieces.append(piece)
        return True

model = pocket.PocketModel.load(sys.argv[2], pocket.LoadOptions())
session = pocket.PocketSession.restore(model, sys.argv[3], pocket.SessionOptions(context_length=256))
listener = Collect()
history = [pocket.ChatMessage(role=r, content=m) for r, m in zip(["user", "assistant", "user"], sys.argv[4:])]
session.chat(history, pocket.GenerateOptions(max_tokens=8, temperature=0.0), listener)
sys.stdout.write("".join(listener.pieces))
"""


def test_a_session_restored_in_another_process_continues_identically(tmp_path, moe, moe_path):
    import subprocess
    import sys

    options = pocket.SessionOptions(context_length=256)
    session = pocket.PocketSession(moe, options)
    opts = pocket.GenerateOptions(max_tokens=8, **GREEDY)
    first = session.chat([pocket.ChatMessage(role="user", content="Hi!")], opts, Collect())
    path = str(tmp_path / "chat.snap")
    session.save(path)
    # The second turn, as the app would render it (the reply becomes an assistant message).
    turns = ["Hi!", first.text, "More?"]
    history = [pocket.ChatMessage(role=r, content=c) for r, c in zip(["user", "assistant", "user"], turns)]
    uninterrupted = session.chat(history, opts, Collect())

    bindings = os.path.dirname(pocket.__file__)
    argv = [sys.executable, "-c", RESTORE_IN_CHILD, bindings, moe_path, path, *turns]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert uninterrupted.text and out.stdout == uninterrupted.text


def test_damaged_or_foreign_snapshots_raise_typed_errors(tmp_path, moe, gemma_tiny):
    options = pocket.SessionOptions(context_length=128)
    session = pocket.PocketSession(moe, options)
    session.generate("Hello", pocket.GenerateOptions(max_tokens=4, **GREEDY), Collect())
    path = tmp_path / "s.snap"
    session.save(str(path))
    data = path.read_bytes()
    for at in (0, 20, len(data) // 2, len(data) - 1):
        damaged = tmp_path / f"flip{at}.snap"
        damaged.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
        with pytest.raises(pocket.PocketError.InvalidArgument):
            pocket.PocketSession.restore(moe, str(damaged), options)
    cut = tmp_path / "cut.snap"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(pocket.PocketError.InvalidArgument, match="truncated|remain"):
        pocket.PocketSession.restore(moe, str(cut), options)
    with pytest.raises(pocket.PocketError.InvalidArgument, match="another model"):
        pocket.PocketSession.restore(gemma_tiny, str(path), options)
    with pytest.raises(pocket.PocketError.Io):
        pocket.PocketSession.restore(moe, str(tmp_path / "missing.snap"), options)
    # The process goes on: the intact snapshot still restores and generates.
    restored = pocket.PocketSession.restore(moe, str(path), options)
    assert restored.generate("Hello again", pocket.GenerateOptions(max_tokens=2, **GREEDY), Collect()).generated_tokens == 2
