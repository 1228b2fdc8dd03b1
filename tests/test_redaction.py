"""kubetune.redact: one definition of a credential in a URI or in text, over a table of hostile inputs.

Every case names the secret strings it hides; the test asserts none of them survives, that the rest of the
URI stays readable (the host is still there), and that masking twice changes nothing (events are masked
when written and logs again when read back).
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap

import pytest

from kubetune import constants as C
from kubetune.errors import SourceError, SpecError
from kubetune.redact import (
    MASK,
    RedactingStream,
    find_credentials,
    has_credentials,
    install,
    is_redacted,
    is_secret_name,
    redact_data,
    redact_text,
    redact_uri,
)

# (URI, secrets that must disappear, text that must stay)
HOSTILE_URIS = [
    ("https://user:pass-9f2k@host.example/x?v=1", ["user", "pass-9f2k"], "host.example/x?v=1"),
    ("https://ghp_Tok3nOnlyUser@github.com/org/repo.git", ["ghp_Tok3nOnlyUser"], "github.com/org/repo.git"),
    ("https://:onlypass77@host/x", ["onlypass77"], "@host/x"),
    ("https://us%40er:p%3Ass%2Fw0rd@host/x", ["us%40er", "p%3Ass%2Fw0rd"], "@host/x"),
    ("https://user:p@ss@w0rd@host/x", ["p@ss", "w0rd"], "@host/x"),  # unescaped @ in the password
    ("https://user:pa/ss7w@host/x", ["pa/ss7w", "ss7w"], "host/x"),  # unescaped / cuts the authority short
    ("https://user:pa?ss7w@host/x", ["ss7w"], "host/x"),
    ("https://user:pa#ss7w@host/x", ["ss7w"], "host/x"),
    ("https://user:pa ss7w@host/x", ["ss7w"], "host/x"),
    ("HTTPS://USER:UPPERPASS1@HOST/X", ["UPPERPASS1"], "HOST/X"),
    ("http://user:pw123456@[::1]:8080/x", ["pw123456"], "[::1]:8080/x"),
    ("//user:schemeless99@host/x", ["schemeless99"], "host/x"),
    ("git+https://oauth2:glpat-abcdef123@gitlab.com/o/r@main", ["glpat-abcdef123", "oauth2"], "gitlab.com/o/r@main"),
    ("s3://AKIAEXAMPLE:s3secret0@bucket/key", ["AKIAEXAMPLE", "s3secret0"], "bucket/key"),
    ("oci://robot:regpass12@registry.io/repo:tag", ["regpass12"], "registry.io/repo:tag"),
    ("hf://user:hf_abcdef123456@org/name", ["hf_abcdef123456"], "org/name"),
    # query parameters, by name: exact names, any case, percent-encoded names, by pattern
    ("https://h/x?token=tok111&v=1", ["tok111"], "v=1"),
    ("https://h/x?access_token=tok222", ["tok222"], "h/x"),
    ("https://h/x?TOKEN=tok333", ["tok333"], "h/x"),
    ("https://h/x?%74oken=tok444", ["tok444"], "h/x"),
    ("https://h/x?token%3Dtok555", ["tok555"], "h/x"),
    ("https://h/x?key=k666&api_key=k777&apikey=k888&X-Api-Key=k999", ["k666", "k777", "k888", "k999"], "h/x"),
    ("https://h/x?secret=s1a&client_secret=s2b&password=s3c&pwd=s4d&pass=s5e&passwd=s6f", ["s1a", "s2b", "s3c", "s4d", "s5e", "s6f"], "h/x"),
    ("https://h/x?access=a1b2&auth=a3b4&Authorization=a5b6&sig=a7b8&signature=a9b0", ["a1b2", "a3b4", "a5b6", "a7b8", "a9b0"], "h/x"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F2024%2Fus&X-Amz-Signature=abcd1234"
     "&X-Amz-Security-Token=FQoGZXIvYXdz", ["AKIA%2F2024", "abcd1234", "FQoGZXIvYXdz"], "X-Amz-Algorithm=AWS4"),
    ("https://storage.googleapis.com/b/o?X-Goog-Credential=svc%40p.iam&X-Goog-Signature=9f8e7d", ["svc%40p.iam", "9f8e7d"], "b/o"),
    ("https://acct.blob.core.windows.net/c/b.jsonl?sv=2022-11-02&se=2030-01-01&sp=r&sr=b&sig=SaSsIg%3D",
     ["SaSsIg", "2030-01-01"], "c/b.jsonl"),
    ("https://h/x?a=1?token=nested77", ["nested77"], "a=1"),
    ("https://h/x?a=1;token=semi88;b=2", ["semi88"], "a=1"),
    ("https://h/x?token=amp%26ersand99", ["ersand99"], "h/x"),
    ("https://h/x#access_token=frag11&token_type=bearer", ["frag11"], "h/x"),
    ("https://h/x;jsessionid=matrix22/y", ["matrix22"], "h/x"),
    ("https://h/x?refresh_token=r1&id_token=r2&session_id=r3&jwt=r4&private_key=r5", ["=r1", "=r2", "=r3", "=r4", "=r5"], "h/x"),
    ("https://u:p4ssw0rd@h/x?token=both33", ["p4ssw0rd", "both33"], "h/x"),
]

# Nothing to mask: these must come back byte for byte.
CLEAN_URIS = [
    "hf://org/name@v1.0",
    "hf://datasets/org/name@main/data/train.jsonl",
    "oci://localhost:5000/repo@sha256:" + "a" * 64,
    "oci://registry.io/repo:tag",
    "s3://bucket/prefix/model",
    "builtin://tiny-chat",
    "/data/train.jsonl",
    "file:///data/x",
    "https://host:8443/path/file.jsonl?v=2&format=json",
    "https://host/d.jsonl#sha256=" + "b" * 64,
    "https://medium.com/@user/post",
    "",
]

# (text, secrets that must disappear, text that must stay)
HOSTILE_TEXTS = [
    ('HTTP Request: GET https://alice:httppw1@127.0.0.1:8000/d.jsonl?token=qtok1 "HTTP/1.1 200 OK"',
     ["alice", "httppw1", "qtok1"], '"HTTP/1.1 200 OK"'),
    ('127.0.0.1:8000 "GET /d.jsonl?X-Amz-Signature=bare2&v=1 HTTP/1.1" 200 12', ["bare2"], "HTTP/1.1"),
    ("ConnectError: [Errno 111] for url 'https://u:conn3@h/x?sig=conn4'", ["conn3", "conn4"], "ConnectError"),
    ("URL('https://u:p\\'q5xyz@host/x')", ["q5xyz"], "host/x"),
    ('{"uri": "https://u:json6@h/x?token=json7", "b": 1}', ["json6", "json7"], '"b": 1}'),
    ("headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAX/1, Signature=hdr8', 'X-Amz-Date': '2024'}",
     ["AKIAX", "hdr8"], "X-Amz-Date"),
    ("Authorization: Bearer eyJhbGci.eyJzdWIi.sig9abc", ["eyJhbGci", "sig9abc"], "Authorization"),
    ("x-amz-security-token: FwoGZXIvsess10", ["FwoGZXIvsess10"], "x-amz-security-token"),
    ("two urls https://a:one11@h1/x and https://b:two12@h2/y?key=three13 end", ["one11", "two12", "three13"], "end"),
    ("error: (https://u:paren14@h/x)", ["paren14"], "error"),
    ("pip install git+https://ghp_pip15@github.com/o/r", ["ghp_pip15"], "github.com/o/r"),
    ("line1\nhttps://u:multi16@h/x\nline3", ["multi16"], "line3"),
    ('{"u": "https:\\/\\/u:esc17@h\\/x?token=esc18"}', ["esc17", "esc18"], '{"u": '),  # JSON with escaped slashes
    ("redirect to https://sso/login?next=https%3A%2F%2Fu%3Aenc19%40h%2Fx%3Ftoken%3Denc20 now", ["enc19", "enc20"], "now"),
    ("https://p/?u=https%253A%252F%252Fu%253Adbl21%2540h", ["dbl21"], "https://p/"),  # encoded twice
    ("Basic dXNlcjpwYXNzMjI=", ["dXNlcjpwYXNzMjI"], "Basic"),
    ("Sending http request: <AWSPreparedRequest stream_output=False, method=GET, url=https://b.s3.amazonaws.com/k?"
     "X-Amz-Signature=bot23&X-Amz-Credential=AKIABOT24%2F1, headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIABOT24/1, "
     "Signature=bot25', 'X-Amz-Security-Token': b'bot26'}>", ["bot23", "AKIABOT24", "bot25", "bot26"], "AWSPreparedRequest"),
]

# Text without credentials, including look-alikes: unchanged.
CLEAN_TEXTS = [
    "step 6/6 loss=1.2345 tokens_per_second=812 max_tokens=5",
    "the chat template emits no end-of-turn token: EOS was appended",
    "Basic settings are fine; every token counts",
    "--set training.learning_rate=1e-4",
    "wrote to alice@example.com and https://host/x",
    "a // b and c//d",
    "Bearer Authentication is described in RFC 6750",
    "https://h/a%20b?v=1&page=2",
]


@pytest.mark.parametrize("uri,secrets,kept", HOSTILE_URIS, ids=[u for u, *_ in HOSTILE_URIS])
def test_redact_uri_masks_every_credential(uri, secrets, kept):
    out = redact_uri(uri)
    for s in secrets:
        assert s not in out, f"{s!r} survives in {out!r}"
    assert kept in out, out
    assert MASK in out
    assert redact_uri(out) == out  # idempotent
    assert has_credentials(uri) and not has_credentials(out)
    # and the same URI inside free text (an error message) is masked as well
    text = redact_text(f"error: {uri}: not found")
    for s in secrets:
        if " " not in uri:  # a blank ends a URI in free text
            assert s not in text, f"{s!r} survives in {text!r}"


@pytest.mark.parametrize("uri", CLEAN_URIS)
def test_redact_uri_leaves_clean_uris_alone(uri):
    assert redact_uri(uri) == uri
    assert redact_text(f"fetched {uri} ok") == f"fetched {uri} ok"
    assert not has_credentials(uri)


def test_redact_uri_exact_forms():
    """The masked URI stays readable: only the credentials change, nothing is re-encoded."""
    assert redact_uri("https://user:pass@host/x?token=abc&v=1") == "https://***@host/x?token=***&v=1"
    assert redact_uri("https://tok@host/x") == "https://***@host/x"
    assert redact_uri("https://h/a%20b?X-Amz-Signature=s&x=%2F") == "https://h/a%20b?X-Amz-Signature=***&x=%2F"
    assert redact_uri("https://user:pa/ss@host/x") == "https://***@host/x"
    assert redact_uri(None) == ""


@pytest.mark.parametrize("text,secrets,kept", HOSTILE_TEXTS, ids=[str(i) for i in range(len(HOSTILE_TEXTS))])
def test_redact_text_masks_credentials_in_free_text(text, secrets, kept):
    out = redact_text(text)
    for s in secrets:
        assert s not in out, f"{s!r} survives in {out!r}"
    assert kept in out
    assert redact_text(out) == out


@pytest.mark.parametrize("text", CLEAN_TEXTS)
def test_redact_text_leaves_prose_alone(text):
    assert redact_text(text) == text


def test_redacted_json_stays_json():
    """events.jsonl lines and KUBETUNE_EVENT lines are masked as text too: they must still parse."""
    line = json.dumps({"message": "GET https://u:pw@h/x?token=t1&a=2", "data": {"uri": "s3://k:s@b/p?sig=z"}})
    out = redact_text(line)
    data = json.loads(out)
    assert data == {"message": "GET https://***@h/x?token=***&a=2", "data": {"uri": "s3://***@b/p?sig=***"}}


@pytest.mark.parametrize(
    "name,secret",
    [("token", True), ("X-Amz-Signature", True), ("x-amz-credential", True), ("X-Goog-Credential", True), ("sv", True),
     ("se", True), ("sp", True), ("sig", True), ("pwd", True), ("PASS", True), ("access", True), ("auth", True),
     ("my_api_key", True), ("ClientSecret", True), ("%74oken", True), ("v", False), ("format", False), ("page", False),
     ("sha256", False), ("revision", False)],
)
def test_secret_parameter_names(name, secret):
    assert is_secret_name(name) is secret


def test_redact_data_walks_structures_and_objects():
    class Url:  # like httpx.URL: an object that prints as a URI
        def __str__(self):
            return "https://u:objpw@h/x"

    data = {"a": ["https://u:p1@h/x", ("x?token=t2",)], "n": 3, "none": None, "obj": Url(), "k": {"uri": "s3://b/k"}}
    out = redact_data(data)
    assert out == {"a": ["https://***@h/x", ("x?token=***",)], "n": 3, "none": None, "obj": "https://***@h/x", "k": {"uri": "s3://b/k"}}
    assert data["a"][0] == "https://u:p1@h/x"  # a copy: the caller's data is untouched


def test_find_credentials_names_the_fields():
    data = {"model": {"source": "hf://org/m"}, "dataset": {"source": "https://u:p@h/d", "mix": [{"source": "https://h/x?sig=1"}]},
            "kubernetes": {"env": {"AUTH_HEADER": "Bearer abc123def456"}}}
    assert find_credentials(data) == ["dataset.source", "dataset.mix.0.source", "kubernetes.env.AUTH_HEADER"]


def test_is_redacted():
    assert is_redacted("https://***@h/x") and is_redacted("https://h/x?token=***")
    assert not is_redacted("https://h/***") and not is_redacted("https://h/x")


def test_errors_are_masked_at_creation():
    """Every KubetuneError carries its message and hint masked, wherever it is printed or stored next."""
    e = SourceError("https://u:errpw1@h/x?token=errtok2: HTTP 404", hint="check https://u:errpw1@h/")
    assert "errpw1" not in str(e) and "errtok2" not in str(e) and "errpw1" not in e.hint and "errpw1" not in repr(e.args)
    assert "https://***@h/x?token=***: HTTP 404" in str(e)
    s = SpecError("bad", problems=["dataset.source: https://u:errpw3@h/x"])
    assert "errpw3" not in " ".join(s.problems)


def test_fetching_a_redacted_uri_says_why_it_cannot_work(tmp_path):
    from kubetune.storage import fetch

    with pytest.raises(SourceError, match=r"masked \(\*\*\*\)") as e:
        fetch("https://***@127.0.0.1:9/x.jsonl", tmp_path)
    assert "never stores credentials" in str(e.value)


def test_log_records_are_masked_for_every_logger_and_handler():
    install()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.DEBUG)
    try:
        class Url:
            def __str__(self):
                return "https://alice:logpw1@127.0.0.1:8000/d.jsonl?token=logtok2"

        logging.getLogger("httpx").info('HTTP Request: %s %s "%s %d %s"', "GET", Url(), "HTTP/1.1", 200, "OK")
        logging.getLogger("urllib3.connectionpool").debug('%s://%s:%s "%s %s %s" %s %s', "https", "h", 443, "GET",
                                                          "/x?X-Amz-Signature=logsig3", "HTTP/1.1", 200, 5)
        logging.getLogger("botocore.endpoint").debug("Making request with params: %r",
                                                      {"headers": {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIALOG4/x"}})
        logging.getLogger("kubetune.x").info("assembled " + "https://" + "u:logpw5@" + "h/x")
        try:
            raise RuntimeError("boom at https://u:logpw6@h/x")
        except RuntimeError:
            logging.getLogger("kubetune.y").exception("failed")
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
    text = stream.getvalue()
    for secret in ("alice", "logpw1", "logtok2", "logsig3", "AKIALOG4", "logpw5", "logpw6"):
        assert secret not in text, f"{secret} leaked: {text}"
    assert 'HTTP Request: GET https://***@127.0.0.1:8000/d.jsonl?token=*** "HTTP/1.1 200 OK"' in text
    assert "RuntimeError: boom at https://***@h/x" in text


def test_redacting_stream_sees_a_uri_printed_in_pieces():
    target = io.StringIO()
    stream = RedactingStream(target)
    print("fetching", "https://u:", end="", file=stream)
    print("piecepw1@h/x?tok", end="", file=stream)
    print("en=piecetok2 done", file=stream)
    stream.write("partial https://u:flushpw3@h/x")
    stream.flush()
    out = target.getvalue()
    assert "piecepw1" not in out and "piecetok2" not in out and "flushpw3" not in out
    assert out == "fetching https://***@h/x?token=*** done\npartial https://***@h/x"


def test_install_masks_a_process_stdout_and_stderr(tmp_path):
    """What the worker does: prints, tracebacks and library output through sys.stdout/sys.stderr."""
    code = textwrap.dedent(
        """
        import sys
        from kubetune.redact import install
        install(stdout=True, stderr=True)
        print("GET https://u:procpw1@h/x?token=proctok2")
        raise RuntimeError("boom https://u:procpw3@h/y")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    both = r.stdout + r.stderr
    assert "procpw1" not in both and "proctok2" not in both and "procpw3" not in both, both
    assert "GET https://***@h/x?token=***" in r.stdout and "RuntimeError: boom https://***@h/y" in r.stderr


def test_mask_constant():
    assert MASK == C.REDACTED == "***"


@pytest.mark.parametrize("uri", ["s3://AKIAPARSE1:parsesecret@bucket/k", "oci://robot:parsesecret@registry.io/repo:t",
                                 "hf://user:hf_parsesecret@org/name"])
def test_schemes_with_environment_credentials_refuse_userinfo(uri):
    """s3://KEY:SECRET@bucket would make 'KEY:SECRET@bucket' the bucket name, repeated by every later message."""
    from kubetune.storage.uri import parse_uri

    with pytest.raises(SourceError, match="carry no credentials") as e:
        parse_uri(uri)
    assert "parsesecret" not in str(e.value) and "AKIAPARSE1" not in str(e.value) and "***@" in str(e.value)
    for fine in ("hf://org/name@rev", "oci://registry.io/repo@sha256:" + "c" * 64, "s3://bucket/a@b"):
        parse_uri(fine)
