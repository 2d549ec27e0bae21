#!/usr/bin/env bash
# Runs the end-to-end tests: starts a real nook serve (built by `make build`)
# on test ports with its own data dir, runs node's test runner against it
# with the published e2b SDK, stops it and checks that nothing leaked.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
data=${NOOK_TEST_DATA:-/var/lib/nook-test}
export NOOK_TEST_API_PORT=${NOOK_TEST_API_PORT:-13000}
export NOOK_TEST_PROXY_PORT=${NOOK_TEST_PROXY_PORT:-13002}
export E2B_API_KEY=e2e-test-key
export E2B_API_URL=http://127.0.0.1:$NOOK_TEST_API_PORT
export E2B_SANDBOX_URL=http://127.0.0.1:$NOOK_TEST_PROXY_PORT
export NOOK_BIN=$root/bin/nook
export NOOK_TEST_DATA=$data
log=$(mktemp /tmp/nook-e2e-XXXX.log)

"$root/bin/nook" serve --data-dir "$data" --api-key "$E2B_API_KEY" \
  --listen 127.0.0.1:$NOOK_TEST_API_PORT --proxy-listen 127.0.0.1:$NOOK_TEST_PROXY_PORT >"$log" 2>&1 &
pid=$!
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
trap stop EXIT
for i in $(seq 1 600); do
  curl -fsS "$E2B_API_URL/health" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "nook serve exited"; exit 1; }
  sleep 0.5
done
curl -fsS "$E2B_API_URL/health" >/dev/null || { cat "$log"; echo "nook serve did not come up"; exit 1; }

status=0
node --test --test-concurrency=1 --test-reporter=spec *.test.mjs || status=$?
stop
trap - EXIT
if [ $status -ne 0 ]; then
  echo "--- nook serve log (tail) ---"; tail -50 "$log"
fi
# Every test kills its sandboxes and a clean stop drains the warm pool, so
# nothing of any sandbox may be left: no mount, bundle or runc container.
leaks=$(grep -c " $data/bundles/" /proc/self/mountinfo || true)
bundles=$(ls -A "$data/bundles" 2>/dev/null | wc -l)
containers=$(runc --root "$data/runc" list -q 2>/dev/null | wc -l)
if [ "$leaks" != 0 ] || [ "$bundles" != 0 ] || [ "$containers" != 0 ]; then
  echo "LEAK after e2e run: $leaks mounts, $bundles bundles, $containers runc containers under $data"
  status=1
fi
exit $status
