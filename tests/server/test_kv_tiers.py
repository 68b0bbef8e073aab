"""The host KV tier behind the server: a prefix evicted from the device's
pages comes back from host memory (usage.prompt_tokens_details.cached_tokens,
the tier's metrics), and cache_ttl is a validated request field."""
import httpx
import pytest

from conftest import API_KEY, MODEL_NAME, Server

SECTION = "Section {i}: the {w} fox number {i} jumps over the lazy dog near the river bank."


def document(word):
    return " ".join(SECTION.format(i=i, w=word) for i in range(40))


@pytest.fixture(scope="module")
def tiered():
    # A device cache of 100 blocks: two ~900-token prompts do not fit in it together.
    s = Server("--api-key", API_KEY, "--kv-cache-tokens", "1600", "--kv-offloading-size", "0.25")
    yield s
    s.stop()


def complete(server, prompt, **extra):
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}
    return httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=120)


def cached_tokens(response):
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_an_evicted_prefix_comes_back_from_host_memory(tiered):
    first = complete(tiered, document("brown") + " Summarise.")
    assert first.status_code == 200, first.text
    assert cached_tokens(first) == 0
    # Two other long prompts push the first one's blocks out of the device's pages.
    for word in ("red", "grey"):
        assert complete(tiered, document(word) + " Summarise.").status_code == 200
    assert tiered.metric("deepinfer:kv_tier_hits_total", tier="host") == 0
    again = complete(tiered, document("brown") + " List the numbers.")
    assert again.status_code == 200, again.text
    assert cached_tokens(again) >= 16 * 50
    assert tiered.metric("deepinfer:kv_tier_hits_total", tier="host") >= 50
    assert tiered.metric("deepinfer:kv_tier_hit_tokens_total") >= 16 * 50
    assert tiered.metric("deepinfer:kv_tier_stored_blocks_total", tier="host") >= 150


def test_cache_ttl_is_a_checked_field(tiered):
    assert complete(tiered, "Hello", cache_ttl=3600).status_code == 200
    bad = complete(tiered, "Hello", cache_ttl=-1)
    assert bad.status_code == 400
    assert "cache_ttl" in bad.text
    assert complete(tiered, "Hello", cache_ttl="soon").status_code == 400
