// Sandbox lifecycle through the published e2b SDK: create, info, list,
// timeouts, kill, expiry, connect and bad input.
import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError, Sandbox, SandboxError } from 'e2b'
import { TEMPLATE, createSandbox, killAll, rejection, sleep, unique, waitFor } from './helpers.mjs'

after(killAll)

async function listAll(opts) {
  const paginator = Sandbox.list({ ...opts, requestTimeoutMs: 10_000 })
  const items = []
  while (paginator.hasNext) items.push(...(await paginator.nextItems()))
  return items
}

// isRunning() must answer false for a sandbox that is gone: the SDK maps a
// 502 from the sandbox-traffic endpoint to false (E2B's proxy answers 502
// "sandbox not found"); anything else makes it throw.
async function assertNotRunning(sbx, what) {
  let running
  try {
    running = await sbx.isRunning({ requestTimeoutMs: 10_000 })
  } catch (e) {
    assert.fail(`${what}: isRunning() threw ${e?.constructor?.name}: ${e?.message} instead of returning false`)
  }
  assert.equal(running, false, `${what}: isRunning()`)
}

function assertNear(actualMs, expectedMs, slackMs, what) {
  assert.ok(
    Math.abs(actualMs - expectedMs) <= slackMs,
    `${what}: ${actualMs} ms is not within ${slackMs} ms of ${expectedMs} ms`,
  )
}

describe('sandbox lifecycle', { timeout: 60_000 }, () => {
  test('create with envs and metadata; getInfo reports them', async (t) => {
    const run = unique('info')
    const before = Date.now()
    const sbx = await createSandbox(t, {
      timeoutMs: 120_000,
      envs: { NOOK_E2E_GREETING: 'hello world', NOOK_E2E_OTHER: 'x=y' },
      metadata: { suite: 'sandbox', run },
    })
    assert.match(sbx.sandboxId, /^[a-z0-9]+$/)

    for (const info of [await sbx.getInfo(), await Sandbox.getInfo(sbx.sandboxId)]) {
      assert.equal(info.sandboxId, sbx.sandboxId)
      assert.equal(info.templateId, TEMPLATE)
      assert.deepEqual(info.metadata, { suite: 'sandbox', run })
      assert.equal(info.state, 'running')
      assert.ok(info.startedAt instanceof Date && !Number.isNaN(info.startedAt.getTime()), 'startedAt is a date')
      assert.ok(info.endAt instanceof Date && !Number.isNaN(info.endAt.getTime()), 'endAt is a date')
      assertNear(info.startedAt.getTime(), before, 10_000, 'startedAt vs creation time')
      assertNear(info.endAt.getTime() - info.startedAt.getTime(), 120_000, 2_000, 'endAt - startedAt')
      assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)
      assert.ok(info.cpuCount > 0, 'cpuCount > 0')
      assert.ok(info.memoryMB > 0, 'memoryMB > 0')
    }

    assert.equal(await sbx.isRunning(), true)
    const r = await sbx.commands.run('printf "%s|%s" "$NOOK_E2E_GREETING" "$NOOK_E2E_OTHER"')
    assert.equal(r.stdout, 'hello world|x=y')
  })

  test('getInfo reports the egress settings the create asked for', async (t) => {
    const open = await createSandbox(t)
    assert.equal((await open.getInfo()).allowInternetAccess, true)
    const closed = await createSandbox(t, {
      allowInternetAccess: false,
      network: { allowOut: ['10.99.0.0/16'], denyOut: ['10.99.1.0/24'] },
    })
    const info = await closed.getInfo()
    assert.equal(info.allowInternetAccess, false)
    assert.deepEqual(info.network?.allowOut, ['10.99.0.0/16'])
    assert.deepEqual(info.network?.denyOut, ['10.99.1.0/24'])
  })

  test('list filters by metadata', async (t) => {
    const run = unique('list')
    const sbx = await createSandbox(t, { metadata: { suite: 'sandbox', run } })
    const other = await createSandbox(t, { metadata: { suite: 'sandbox', run: `${run}-other` } })

    const found = await listAll({ query: { metadata: { run } } })
    assert.deepEqual(found.map((s) => s.sandboxId), [sbx.sandboxId])
    assert.equal(found[0].templateId, TEMPLATE)
    assert.equal(found[0].state, 'running')
    assert.deepEqual(found[0].metadata, { suite: 'sandbox', run })

    // Both keys must match (AND).
    const both = await listAll({ query: { metadata: { suite: 'sandbox', run } } })
    assert.deepEqual(both.map((s) => s.sandboxId), [sbx.sandboxId])
    assert.deepEqual(await listAll({ query: { metadata: { suite: 'nope', run } } }), [])

    // A value that matches nothing.
    assert.deepEqual(await listAll({ query: { metadata: { run: `${run}-missing` } } }), [])

    // State filters.
    const running = await listAll({ query: { metadata: { run }, state: ['running'] } })
    assert.deepEqual(running.map((s) => s.sandboxId), [sbx.sandboxId])
    assert.deepEqual(await listAll({ query: { metadata: { run }, state: ['paused'] } }), [])

    // Unfiltered listing includes both.
    const all = (await listAll({})).map((s) => s.sandboxId)
    assert.ok(all.includes(sbx.sandboxId) && all.includes(other.sandboxId), 'unfiltered list has both sandboxes')
  })

  test('setTimeout moves endAt', async (t) => {
    const sbx = await createSandbox(t, { timeoutMs: 60_000 })
    const first = await sbx.getInfo()

    let now = Date.now()
    await sbx.setTimeout(600_000)
    let info = await sbx.getInfo()
    assertNear(info.endAt.getTime(), now + 600_000, 5_000, 'endAt after setTimeout(600 s)')
    assert.ok(info.endAt > first.endAt, 'endAt moved later')
    assert.equal(info.startedAt.getTime(), first.startedAt.getTime(), 'startedAt unchanged')

    // Shortening works too, and the static form does the same.
    now = Date.now()
    await Sandbox.setTimeout(sbx.sandboxId, 30_000)
    info = await sbx.getInfo()
    assertNear(info.endAt.getTime(), now + 30_000, 5_000, 'endAt after setTimeout(30 s)')
    assert.equal(info.state, 'running')
  })

  test('kill removes the sandbox', async (t) => {
    const run = unique('kill')
    const sbx = await createSandbox(t, { metadata: { run } })
    const id = sbx.sandboxId
    await sbx.commands.run('true')

    await sbx.kill()

    const err = await rejection(Sandbox.getInfo(id), 'getInfo after kill')
    assert.ok(err instanceof NotFoundError, `getInfo after kill: expected NotFoundError, got ${err?.constructor?.name}: ${err?.message}`)
    const err2 = await rejection(Sandbox.connect(id, { timeoutMs: 60_000 }), 'connect after kill')
    assert.ok(err2 instanceof NotFoundError, `connect after kill: expected NotFoundError, got ${err2?.constructor?.name}: ${err2?.message}`)
    assert.equal(await Sandbox.kill(id), false, 'killing it again reports not found')
    assert.deepEqual(await listAll({ query: { metadata: { run } } }), [])
    await rejection(sbx.commands.run('true', { requestTimeoutMs: 10_000 }), 'command after kill')
    await assertNotRunning(sbx, 'after kill')
  })

  test('a sandbox dies at its end time', async (t) => {
    const run = unique('expiry')
    const created = Date.now()
    const sbx = await createSandbox(t, { timeoutMs: 3_000, metadata: { run } })
    const info = await sbx.getInfo()
    assert.equal(info.state, 'running')
    assertNear(info.endAt.getTime() - info.startedAt.getTime(), 3_000, 1_000, 'endAt - startedAt')
    await sleep(Math.max(0, created + 1_500 - Date.now()))
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n', 'still alive before its end time')

    // Gone within ~6 s of creation (3 s timeout plus slack), polled.
    await waitFor(
      async () => {
        try {
          await Sandbox.getInfo(sbx.sandboxId, { requestTimeoutMs: 5_000 })
          return false
        } catch (e) {
          if (e instanceof NotFoundError) return true
          throw e
        }
      },
      { timeoutMs: Math.max(0, created + 7_000 - Date.now()), intervalMs: 200, what: 'the expired sandbox to disappear' },
    )
    const gone = Date.now() - created
    assert.ok(gone >= 2_500, `sandbox disappeared after only ${gone} ms (timeout 3000 ms)`)
    assert.deepEqual(await listAll({ query: { metadata: { run } } }), [])
    await rejection(sbx.commands.run('true', { requestTimeoutMs: 10_000 }), 'command after expiry')
    await assertNotRunning(sbx, 'after expiry')
  })

  test('connect to a running sandbox (no options, as documented)', async (t) => {
    const sbx = await createSandbox(t, { timeoutMs: 600_000, envs: { NOOK_E2E_C: 'connected' } })
    await sbx.files.write('/home/user/connect.txt', 'from the first handle')

    // The SDK sends POST /v2/sandboxes/{id}/connect with body {} here.
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(again.sandboxId, sbx.sandboxId)
    assert.equal(await again.files.read('/home/user/connect.txt'), 'from the first handle')
    assert.equal((await again.commands.run('echo $NOOK_E2E_C')).stdout, 'connected\n')
    // Connecting without a timeout must not make it expire soon.
    const info = await again.getInfo()
    assert.ok(info.endAt.getTime() >= Date.now() + 250_000, `endAt ${info.endAt.toISOString()} is too soon after connect`)
  })

  test('connect with a timeout extends it', async (t) => {
    const sbx = await createSandbox(t, { timeoutMs: 30_000 })
    const now = Date.now()
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
    assert.equal(again.sandboxId, sbx.sandboxId)
    assert.equal((await again.commands.run('echo ok')).stdout, 'ok\n')
    const info = await again.getInfo()
    assertNear(info.endAt.getTime(), now + 300_000, 5_000, 'endAt after connect(timeoutMs 300 s)')
    // The instance method too.
    await sbx.connect({ timeoutMs: 300_000 })
  })

  test('connect to an unknown sandbox is NotFound', async () => {
    const err = await rejection(Sandbox.connect('i0000000000nonexistent', { timeoutMs: 60_000 }), 'connect unknown')
    assert.ok(err instanceof NotFoundError, `expected NotFoundError, got ${err?.constructor?.name}: ${err?.message}`)
    const err2 = await rejection(Sandbox.getInfo('i0000000000nonexistent'), 'getInfo unknown')
    assert.ok(err2 instanceof NotFoundError, `expected NotFoundError, got ${err2?.constructor?.name}: ${err2?.message}`)
  })

  test('bad input is rejected and creates nothing', async () => {
    const run = unique('bad')
    const tryCreate = (template, opts) => rejection(createSandbox(null, { metadata: { run }, ...opts }, template), `create ${template} ${JSON.stringify(opts)}`)

    const tpl = await tryCreate('nook-e2e-no-such-template', {})
    assert.ok(tpl instanceof SandboxError, `unknown template: got ${tpl?.constructor?.name}: ${tpl?.message}`)
    assert.match(tpl.message, /nook-e2e-no-such-template/)
    assert.ok(tpl.statusCode >= 400 && tpl.statusCode < 500, `unknown template: status ${tpl.statusCode}, want 4xx`)

    for (const name of ['A=B', '', 'A\u0000B']) {
      const err = await tryCreate(TEMPLATE, { envs: { [name]: 'x' } })
      assert.ok(err instanceof SandboxError, `env name ${JSON.stringify(name)}: got ${err?.constructor?.name}: ${err?.message}`)
      assert.equal(err.statusCode, 400, `env name ${JSON.stringify(name)}: ${err.message}`)
    }

    assert.deepEqual(await listAll({ query: { metadata: { run } } }), [], 'a rejected create left a sandbox behind')
  })
})
