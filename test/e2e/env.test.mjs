// The CubeSandbox environment-visibility table, row by row and column by
// column, through the published e2b SDK (commands.run, PTY), `nook exec`
// (OCI exec) and the template's start command (main process / services).
// The template is built from a Dockerfile with an image ENV plus a template
// --env, as in the seed.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createSandbox, killAll, unique, waitFor } from './helpers.mjs'

const NOOK = process.env.NOOK_BIN
const cliEnv = {
  ...process.env,
  NOOK_API_URL: process.env.E2B_API_URL,
  NOOK_API_KEY: process.env.E2B_API_KEY,
  NOOK_SANDBOX_URL: process.env.E2B_SANDBOX_URL,
}

// nook runs the nook CLI and resolves {stdout, stderr, code}.
function nook(args, { input, timeoutMs = 120_000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = execFile(NOOK, args, { env: cliEnv, timeout: timeoutMs, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err && typeof err.code !== 'number') return reject(new Error(`nook ${args.join(' ')}: ${err.message}\n${stderr}`))
      resolve({ stdout, stderr, code: err ? err.code : 0 })
    })
    if (input !== undefined) child.stdin.end(input)
    else child.stdin.end()
  })
}

const ALIAS = unique('env-e2e').toLowerCase()
const MAIN_ENV = '/tmp/main-env'
// Prints the three layers' marker variables.
const PROBE = 'echo "${IMG_ONLY-unset}|${TPL_ENV-unset}|${SBX_ONLY-unset}|${DEMO_ENV-unset}"'

before(async () => {
  const dir = mkdtempSync(join(tmpdir(), 'nook-env-e2e-'))
  try {
    writeFileSync(join(dir, 'Dockerfile'), [
      'FROM base',
      'ENV DEMO_ENV=template-only IMG_ONLY=from-image',
      `CMD ["/bin/sh", "-c", "env > ${MAIN_ENV}; exec sleep infinity"]`,
      '',
    ].join('\n'))
    const r = await nook(['tpl', 'build', '--alias', ALIAS, '--env', 'TPL_ENV=from-tpl-env', dir], { timeoutMs: 600_000 })
    assert.equal(r.code, 0, `template build failed: ${r.stdout}\n${r.stderr}`)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})
after(async () => {
  await killAll()
  await nook(['tpl', 'delete', ALIAS]).catch(() => {})
})

async function ptyRun(sbx, line, opts = {}) {
  const decoder = new TextDecoder()
  let text = ''
  const h = await sbx.pty.create({ cols: 120, rows: 24, timeoutMs: 60_000, onData: (d) => { text += decoder.decode(d, { stream: true }) }, ...opts })
  try {
    // The marker is computed by the shell so that the echoed input never matches.
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode(`${line}; echo "done-$((40+2))"\n`))
    await waitFor(() => /done-42/.test(text), { timeoutMs: 15_000, what: `PTY output (got ${JSON.stringify(text.slice(-300))})` })
    return text
  } finally {
    await sbx.pty.kill(h.pid).catch(() => {})
  }
}

describe('environment visibility (CubeSandbox table)', { timeout: 300_000 }, () => {
  test('row "image ENV / template --env": not in commands.run or PTY; in nook exec and the main process', async (t) => {
    const sbx = await createSandbox(t, {}, ALIAS)
    const r = await sbx.commands.run('echo -n DEMO_ENV=$DEMO_ENV')
    assert.equal(r.stdout, 'DEMO_ENV=')
    assert.equal((await sbx.commands.run(PROBE)).stdout, 'unset|unset|unset|unset\n')
    const pty = await ptyRun(sbx, 'echo "P:${DEMO_ENV-unset}:${TPL_ENV-unset}:"')
    assert.match(pty, /P:unset:unset:/)

    const ex = await nook(['exec', sbx.sandboxId, '--', '/bin/sh', '-c', PROBE])
    assert.equal(ex.code, 0, ex.stderr)
    assert.equal(ex.stdout, 'from-image|from-tpl-env|unset|template-only\n')

    const main = await nook(['exec', sbx.sandboxId, '--', 'cat', MAIN_ENV])
    assert.equal(main.code, 0, main.stderr)
    assert.match(main.stdout, /^DEMO_ENV=template-only$/m)
    assert.match(main.stdout, /^TPL_ENV=from-tpl-env$/m)
  })

  test('row "Sandbox.create(envs)": in commands.run and PTY; not in nook exec nor the main process', async (t) => {
    const sbx = await createSandbox(t, { envs: { DEMO_ENV: 'sandbox-only', SBX_ONLY: 'from-create' } }, ALIAS)
    assert.equal((await sbx.commands.run('echo -n "DEMO_ENV=$DEMO_ENV"')).stdout, 'DEMO_ENV=sandbox-only')
    assert.equal((await sbx.commands.run(PROBE)).stdout, 'unset|unset|from-create|sandbox-only\n')
    assert.match(await ptyRun(sbx, 'echo "P:$DEMO_ENV:$SBX_ONLY:"'), /P:sandbox-only:from-create:/)

    const ex = await nook(['exec', sbx.sandboxId, '--', '/bin/sh', '-c', PROBE])
    assert.equal(ex.stdout, 'from-image|from-tpl-env|unset|template-only\n')
    const main = await nook(['exec', sbx.sandboxId, '--', 'cat', MAIN_ENV])
    assert.doesNotMatch(main.stdout, /SBX_ONLY|sandbox-only/)
    assert.match(main.stdout, /^DEMO_ENV=template-only$/m)
  })

  test('row "command / PTY call envs": this call only, highest priority; no effect on the main process', async (t) => {
    const sbx = await createSandbox(t, { envs: { DEMO_ENV: 'sandbox-only' } }, ALIAS)
    const r = await sbx.commands.run('echo -n "DEMO_ENV=$DEMO_ENV"', { envs: { DEMO_ENV: 'one-shot' } })
    assert.equal(r.stdout, 'DEMO_ENV=one-shot')
    assert.equal((await sbx.commands.run('echo -n "DEMO_ENV=$DEMO_ENV"')).stdout, 'DEMO_ENV=sandbox-only')
    assert.match(await ptyRun(sbx, 'echo "P:$DEMO_ENV:"', { envs: { DEMO_ENV: 'pty-call' } }), /P:pty-call:/)
    assert.match(await ptyRun(sbx, 'echo "P:$DEMO_ENV:"'), /P:sandbox-only:/)
    // Background commands see their call envs too, and only they do.
    const bg = await sbx.commands.run('echo "$CALL_ONLY" > /tmp/bg-env', { envs: { CALL_ONLY: 'bg-call' }, background: true })
    await bg.wait()
    assert.equal((await sbx.commands.run('cat /tmp/bg-env; echo "${CALL_ONLY-unset}"')).stdout, 'bg-call\nunset\n')
    // n/a for OCI exec, no effect on the main process.
    const main = await nook(['exec', sbx.sandboxId, '--', 'cat', MAIN_ENV])
    assert.doesNotMatch(main.stdout, /one-shot|pty-call|bg-call/)
  })

  test('nook exec: exit code passed through, stdin with -i', async (t) => {
    const sbx = await createSandbox(t, {}, ALIAS)
    assert.equal((await nook(['exec', sbx.sandboxId, '--', '/bin/sh', '-c', 'exit 3'])).code, 3)
    const cat = await nook(['exec', '-i', sbx.sandboxId, '--', 'cat'], { input: 'piped\n' })
    assert.equal(cat.stdout, 'piped\n')
    const bad = await nook(['exec', 'inosuchsandbox', '--', 'true'])
    assert.notEqual(bad.code, 0)
    assert.match(bad.stderr, /not found/)
  })
})
