#!/usr/bin/env bash
# Examples of LAIR's OpenAI-compatible HTTP API with curl.
#   LAIR_URL (default http://localhost:8000), LAIR_API_KEY (if the server
#   was started with --api-key), LAIR_MODEL (default: the first served model).
set -euo pipefail

URL=${LAIR_URL:-http://localhost:8000}
AUTH=()
if [[ -n "${LAIR_API_KEY:-}" ]]; then AUTH=(-H "Authorization: Bearer ${LAIR_API_KEY}"); fi
MODEL=${LAIR_MODEL:-$(curl -sS "${AUTH[@]}" "$URL/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')}

echo "== health";  curl -sS "$URL/health"; echo
echo "== models";  curl -sS "${AUTH[@]}" "$URL/v1/models"; echo

echo "== completion"
curl -sS "${AUTH[@]}" "$URL/v1/completions" -H 'Content-Type: application/json' -d @- <<JSON
{"model": "$MODEL", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
JSON
echo

echo "== chat completion"
curl -sS "${AUTH[@]}" "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d @- <<JSON
{"model": "$MODEL", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
JSON
echo

echo "== streaming completion (server-sent events)"
curl -sS -N "${AUTH[@]}" "$URL/v1/completions" -H 'Content-Type: application/json' -d @- <<JSON
{"model": "$MODEL", "prompt": "Count:", "max_tokens": 8, "stream": true,
 "stream_options": {"include_usage": true}}
JSON

echo "== metrics (first lines)"
curl -sS "$URL/metrics" | head -20
