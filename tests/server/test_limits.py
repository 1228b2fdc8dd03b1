"""The jobs service's limits as a client meets them: uploads over ``max_upload_bytes`` (413) and requests over
``rate_limit_per_minute`` per key (429 with Retry-After), each in OpenAI's error shape."""

from __future__ import annotations

import openai
import pytest


def test_upload_size_and_rate_limits(make_server, train_file, tmp_path):
    server = make_server(max_upload_bytes=4096, rate_limit_per_minute=8).start()
    key, other = server.key("alpha"), server.key("beta")
    client = server.openai(key)
    big = tmp_path / "big.jsonl"
    big.write_bytes(train_file.read_bytes() * 2)
    assert big.stat().st_size > 4096
    with pytest.raises(openai.APIStatusError) as e:
        client.files.create(file=big.open("rb"), purpose="fine-tune")
    assert e.value.status_code == 413 and e.value.code == "file_too_large" and "4096" in e.value.message
    assert server.openai(other).files.list().data == []  # beta's first request: nothing of the refused upload kept

    for _ in range(6):  # 8 a minute: the upload and the 6 lists pass, the next ones do not
        client.files.list()
    with pytest.raises(openai.RateLimitError) as e:
        for _ in range(3):
            client.files.list()
    assert e.value.code == "rate_limit_exceeded" and int(e.value.response.headers["Retry-After"]) >= 1
    assert server.openai(other).files.list().data == []  # another key has its own budget
