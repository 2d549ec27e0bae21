// Commands through the published e2b SDK: foreground and background runs,
// users, cwd, environment, stdin, streaming, large output, list, kill and
// timeouts. One sandbox serves the whole file.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError, InvalidArgumentError, TimeoutError } from 'e2b'
import { createSandbox, killAll, rejection, sha256, sleep, waitFor, withTimeout } from './helpers.mjs'

const SANDBOX_ENVS = { NOOK_E2E_SBX: 'sandbox-value', NOOK_E2E_OVER: 'from-sandbox' }
let sbx

before(async () => {
  sbx = await createSandbox(null, { timeoutMs: 300_000, envs: SANDBOX_ENVS })
})
after(killAll)

// env returns the environment a command sees, parsed from `env -0`.
async function envOf(opts = {}) {
  const r = await sbx.commands.run('env -0', opts)
  const out = {}
  for (const kv of r.stdout.split('\0')) {
    if (!kv) continue
    const i = kv.indexOf('=')
    out[kv.slice(0, i)] = kv.slice(i + 1)
  }
  return out
}

async function runningPids() {
  return (await sbx.commands.list()).map((p) => p.pid)
}

describe('commands', { timeout: 120_000 }, () => {
  test('foreground run returns stdout, stderr and exit code', async () => {
    const r = await sbx.commands.run('echo out; echo err >&2; printf "no newline"')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\nno newline')
    assert.equal(r.stderr, 'err\n')
    assert.equal(r.error, undefined)

    const err = await rejection(sbx.commands.run('echo partial; echo bad >&2; exit 7'), 'exit 7')
    assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.constructor?.name}: ${err?.message}`)
    assert.equal(err.exitCode, 7)
    assert.equal(err.stdout, 'partial\n')
    assert.equal(err.stderr, 'bad\n')

    // A shell syntax error is bash's exit code 2, reported the same way.
    const syntax = await rejection(sbx.commands.run('if then fi'), 'syntax error')
    assert.ok(syntax instanceof CommandExitError)
    assert.equal(syntax.exitCode, 2)
    assert.match(syntax.stderr, /syntax error/)
  })

  test('cwd option', async () => {
    assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n', 'default cwd is the user home')
    assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
    assert.equal((await sbx.commands.run('pwd', { cwd: '/' })).stdout, '/\n')
    assert.equal((await sbx.commands.run('pwd', { cwd: '/root', user: 'root' })).stdout, '/root\n')
    const err = await rejection(sbx.commands.run('pwd', { cwd: '/nook-e2e-no-such-dir' }), 'missing cwd')
    assert.ok(err instanceof InvalidArgumentError, `missing cwd: expected InvalidArgumentError, got ${err?.constructor?.name}: ${err?.message}`)
  })

  test('user option: default user vs root', async () => {
    assert.equal((await sbx.commands.run('id -un')).stdout, 'user\n')
    assert.equal((await sbx.commands.run('id -un', { user: 'user' })).stdout, 'user\n')
    assert.equal((await sbx.commands.run('id -un')).stdout, 'user\n')
    const root = await sbx.commands.run('id -un; id -u; echo $HOME; pwd', { user: 'root' })
    assert.equal(root.stdout, 'root\n0\n/root\n/root\n')
    const user = await sbx.commands.run('id -u; echo $HOME; touch /home/user/owned; stat -c %U:%G /home/user/owned')
    assert.notEqual(user.stdout.split('\n')[0], '0', 'the default user is not uid 0')
    assert.equal(user.stdout.split('\n').slice(1).join('\n'), '/home/user\nuser:user\n')
    // The default user cannot write where only root can.
    const denied = await rejection(sbx.commands.run('touch /root/nope'), 'touch /root as user')
    assert.ok(denied instanceof CommandExitError)
    assert.match(denied.stderr, /Permission denied/)
  })

  test('environment: exactly HOME/USER/LOGNAME/PATH, sandbox envs and call envs', async () => {
    const shellSet = ['PWD', 'SHLVL', '_']
    const base = ['HOME', 'LOGNAME', 'PATH', 'USER']

    const env = await envOf({ envs: { NOOK_E2E_CALL: 'call-value', NOOK_E2E_OVER: 'from-call' } })
    assert.deepEqual(
      Object.keys(env).sort(),
      [...base, ...shellSet, 'NOOK_E2E_CALL', 'NOOK_E2E_OVER', 'NOOK_E2E_SBX'].sort(),
      `unexpected environment: ${JSON.stringify(env)}`,
    )
    assert.equal(env.HOME, '/home/user')
    assert.equal(env.USER, 'user')
    assert.equal(env.LOGNAME, 'user')
    assert.match(env.PATH, /(^|:)\/usr\/bin(:|$)/)
    assert.equal(env.NOOK_E2E_SBX, 'sandbox-value')
    assert.equal(env.NOOK_E2E_OVER, 'from-call', 'a call env overrides the sandbox env')
    assert.equal(env.NOOK_E2E_CALL, 'call-value')

    // The override was for that call only.
    const plain = await envOf()
    assert.deepEqual(Object.keys(plain).sort(), [...base, ...shellSet, 'NOOK_E2E_OVER', 'NOOK_E2E_SBX'].sort())
    assert.equal(plain.NOOK_E2E_OVER, 'from-sandbox')

    const root = await envOf({ user: 'root' })
    assert.deepEqual(Object.keys(root).sort(), [...base, ...shellSet, 'NOOK_E2E_OVER', 'NOOK_E2E_SBX'].sort())
    assert.equal(root.HOME, '/root')
    assert.equal(root.USER, 'root')
    assert.equal(root.LOGNAME, 'root')

    // Values survive byte for byte.
    const tricky = 'a b\t"c" \'d\' $e `f` ü€\nsecond line'
    const r = await sbx.commands.run('printf %s "$NOOK_E2E_TRICKY"', { envs: { NOOK_E2E_TRICKY: tricky } })
    assert.equal(r.stdout, tricky)
  })

  test('background command: wait', async () => {
    const h = await sbx.commands.run('sleep 0.5; echo done; echo warn >&2', { background: true })
    assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
    assert.equal(h.exitCode, undefined, 'still running right after start')
    const r = await withTimeout(h.wait(), 10_000, 'background wait')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'done\n')
    assert.equal(r.stderr, 'warn\n')
    assert.equal(h.exitCode, 0)

    const failing = await sbx.commands.run('sleep 0.2; exit 3', { background: true })
    const err = await rejection(withTimeout(failing.wait(), 10_000, 'failing wait'), 'background exit 3')
    assert.ok(err instanceof CommandExitError, `got ${err?.constructor?.name}: ${err?.message}`)
    assert.equal(err.exitCode, 3)
  })

  test('background command: list and kill', async () => {
    const h = await sbx.commands.run('sleep 61', { background: true })
    const procs = await sbx.commands.list()
    const p = procs.find((x) => x.pid === h.pid)
    assert.ok(p, `commands.list ${JSON.stringify(procs)} lacks pid ${h.pid}`)
    assert.equal(p.cmd, '/bin/bash')
    assert.deepEqual(p.args, ['-l', '-c', 'sleep 61'])

    assert.equal(await h.kill(), true)
    const err = await rejection(withTimeout(h.wait(), 10_000, 'wait after kill'), 'wait of a killed command')
    assert.ok(err instanceof CommandExitError, `got ${err?.constructor?.name}: ${err?.message}`)
    assert.notEqual(err.exitCode, 0)
    await waitFor(async () => !(await runningPids()).includes(h.pid), { timeoutMs: 5_000, what: 'the killed command to leave commands.list' })
    const ps = await sbx.commands.run('ps -eo args').then((r) => r.stdout)
    assert.ok(!ps.includes('sleep 61'), `sleep 61 still runs:\n${ps}`)
    assert.equal(await sbx.commands.kill(h.pid), false, 'killing it again reports not found')

    // Killing by pid through the module works as well.
    const h2 = await sbx.commands.run('sleep 62', { background: true })
    assert.equal(await sbx.commands.kill(h2.pid), true)
    await rejection(withTimeout(h2.wait(), 10_000, 'wait after commands.kill'), 'wait of a killed command')
  })

  test('reconnect to a background command', async () => {
    const h = await sbx.commands.run('for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.2; done', { background: true })
    await h.disconnect()
    // Disconnecting only stops the event stream: the command keeps running.
    await sleep(300)
    const procs = await runningPids()
    assert.ok(procs.includes(h.pid), `the command (pid ${h.pid}) died when the SDK disconnected from it; running: ${JSON.stringify(procs)}`)
    const chunks = []
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => chunks.push(d) })
    const r = await withTimeout(again.wait(), 10_000, 'reconnected wait')
    assert.equal(r.exitCode, 0)
    assert.match(chunks.join(''), /tick6\n$/)
  })

  test('stdin: sendStdin and closeStdin', async () => {
    const out = []
    const h = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => out.push(d) })
    await h.sendStdin('hello\n')
    // cat echoes it before stdin is closed.
    await waitFor(() => out.join('') === 'hello\n', { timeoutMs: 5_000, what: 'cat to echo the first line' })
    await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('wörld\n'))
    await waitFor(() => out.join('') === 'hello\nwörld\n', { timeoutMs: 5_000, what: 'cat to echo the second line' })
    assert.equal(h.exitCode, undefined, 'cat still runs while stdin is open')
    await h.closeStdin()
    const r = await withTimeout(h.wait(), 10_000, 'cat to end after closeStdin')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello\nwörld\n')

    // Without stdin: true the command reads EOF at once.
    const t0 = Date.now()
    const r2 = await sbx.commands.run('cat; echo eof', { timeoutMs: 10_000 })
    assert.equal(r2.stdout, 'eof\n')
    assert.ok(Date.now() - t0 < 5_000)

    // Larger stdin arrives intact (a line at a time, then EOF).
    const lines = Array.from({ length: 200 }, (_, i) => `line ${i} ${'x'.repeat(i)}`)
    const h3 = await sbx.commands.run('sha256sum', { background: true, stdin: true })
    for (let i = 0; i < lines.length; i += 50) await h3.sendStdin(lines.slice(i, i + 50).join('\n') + '\n')
    await h3.closeStdin()
    const r3 = await withTimeout(h3.wait(), 10_000, 'sha256sum of stdin')
    assert.equal(r3.stdout.split(' ')[0], sha256(lines.join('\n') + '\n'))
  })

  test('onStdout/onStderr stream output as it is produced', async () => {
    const t0 = Date.now()
    const out = []
    const err = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.4; done', {
      onStdout: (d) => out.push({ at: Date.now() - t0, d }),
      onStderr: (d) => err.push({ at: Date.now() - t0, d }),
    })
    const total = Date.now() - t0
    assert.equal(out.map((c) => c.d).join(''), 'out1\nout2\nout3\n')
    assert.equal(err.map((c) => c.d).join(''), 'err1\nerr2\nerr3\n')
    assert.equal(r.stdout, 'out1\nout2\nout3\n')
    assert.equal(r.stderr, 'err1\nerr2\nerr3\n')
    for (const [name, chunks] of [['stdout', out], ['stderr', err]]) {
      assert.ok(chunks.length >= 3, `${name} came in ${chunks.length} chunk(s), not progressively`)
      assert.ok(chunks[0].at <= total - 700, `${name}: first chunk at ${chunks[0].at} ms, command took ${total} ms`)
    }
  })

  test('10 MB of output arrives intact', { timeout: 60_000 }, async () => {
    // 7864320 random bytes are exactly 10485760 base64 characters.
    let streamed = 0
    const r = await sbx.commands.run('head -c 7864320 /dev/urandom | base64 -w 0 > /tmp/big.b64 && cat /tmp/big.b64', {
      timeoutMs: 50_000,
      onStdout: (d) => {
        streamed += d.length
      },
    })
    assert.equal(r.stdout.length, 10_485_760)
    assert.equal(streamed, 10_485_760)
    const sum = await sbx.commands.run('sha256sum /tmp/big.b64')
    assert.equal(sha256(r.stdout), sum.stdout.split(' ')[0])

    // Same on stderr, from a different generator.
    const e = await sbx.commands.run('yes nook-e2e | head -c 10485760 >&2', { timeoutMs: 50_000 })
    assert.equal(e.stderr.length, 10_485_760)
    assert.equal(e.stdout, '')
    assert.equal(sha256(e.stderr), sha256('nook-e2e\n'.repeat(Math.ceil(10_485_760 / 9)).slice(0, 10_485_760)))
  })

  test('multi-byte UTF-8 survives chunking', async () => {
    const unit = 'ä€😀'
    const r = await sbx.commands.run(`python3 -c "import sys; sys.stdout.write('${unit}' * 200000)"`, { timeoutMs: 30_000 })
    assert.equal(r.stdout.length, unit.length * 200_000)
    assert.ok(r.stdout === unit.repeat(200_000), 'stdout differs from the expected multi-byte text')
  })

  test('timeoutMs kills a long command', async () => {
    const t0 = Date.now()
    const err = await rejection(sbx.commands.run('sleep 37', { timeoutMs: 2_000 }), 'sleep 37 with timeoutMs 2000')
    const took = Date.now() - t0
    assert.ok(err instanceof TimeoutError, `expected TimeoutError, got ${err?.constructor?.name}: ${err?.message}`)
    assert.ok(took >= 1_800 && took < 8_000, `timed out after ${took} ms`)
    await waitFor(
      async () => !(await sbx.commands.run('ps -eo args')).stdout.includes('sleep 37'),
      { timeoutMs: 5_000, what: 'the timed-out command to be killed in the sandbox' },
    )

    // A background command with a timeout is killed too.
    const h = await sbx.commands.run('sleep 38', { background: true, timeoutMs: 1_000 })
    await rejection(withTimeout(h.wait(), 10_000, 'background wait with timeoutMs'), 'background sleep 38 with timeoutMs 1000')
    await waitFor(
      async () => !(await sbx.commands.run('ps -eo args')).stdout.includes('sleep 38'),
      { timeoutMs: 5_000, what: 'the timed-out background command to be killed' },
    )
  })

  test('many short commands in a row all complete', { timeout: 90_000 }, async () => {
    // Each run is one Process/Start stream through the proxy; none may be cut off.
    const failures = []
    for (let i = 0; i < 200; i++) {
      try {
        const r = await sbx.commands.run(`echo run${i}`, { timeoutMs: 10_000 })
        if (r.stdout !== `run${i}\n`) failures.push(`${i}: stdout ${JSON.stringify(r.stdout)}`)
      } catch (e) {
        failures.push(`${i}: ${e?.constructor?.name}: ${e?.message}`)
      }
    }
    assert.deepEqual(failures, [], `${failures.length}/200 runs failed`)
  })
})
