// PTY sessions through the published e2b SDK: create, input, output,
// resize, Ctrl-C, exit and kill.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { createSandbox, killAll, rejection, waitFor, withTimeout } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await createSandbox(null, { timeoutMs: 180_000 })
})
after(killAll)

// openPty starts a PTY and collects its output as text.
async function openPty(size = { cols: 80, rows: 24 }) {
  const decoder = new TextDecoder()
  const term = { text: '' }
  const handle = await sbx.pty.create({
    ...size,
    timeoutMs: 60_000,
    onData: (d) => {
      term.text += decoder.decode(d, { stream: true })
    },
  })
  term.handle = handle
  term.pid = handle.pid
  // Remember how the session's event stream ended, to explain a failed send.
  handle.wait().then(
    (r) => (term.ended = `exited with ${r.exitCode}`),
    (e) => (term.ended = `${e?.constructor?.name}: ${e?.message}`),
  )
  term.send = async (s) => {
    try {
      await sbx.pty.sendInput(handle.pid, new TextEncoder().encode(s))
    } catch (e) {
      await waitFor(() => term.ended, { timeoutMs: 1_000, what: 'stream end' }).catch(() => {})
      throw new Error(`sendInput to PTY ${handle.pid} failed (${e?.constructor?.name}: ${e?.message}); its event stream had ended: ${term.ended ?? 'no'}`, { cause: e })
    }
  }
  // expect waits until the output after `from` matches re.
  term.expect = async (re, from = 0, timeoutMs = 10_000) => {
    await waitFor(() => re.test(term.text.slice(from)), { timeoutMs, intervalMs: 50, what: `PTY output matching ${re} (got ${JSON.stringify(term.text.slice(from).slice(-400))})` })
    return term.text.slice(from).match(re)
  }
  return term
}

describe('pty', { timeout: 60_000 }, () => {
  test('create, run a command, read its output, resize, kill', async () => {
    const term = await openPty({ cols: 80, rows: 24 })
    let killed
    try {
      assert.ok(Number.isInteger(term.pid) && term.pid > 0)
      const procs = await sbx.commands.list()
      assert.ok(procs.some((p) => p.pid === term.pid), `commands.list ${JSON.stringify(procs)} lacks the PTY ${term.pid}`)

      // The marker is computed by the shell, so the echoed input never matches it.
      let mark = term.text.length
      await term.send('stty size; echo "mark-$((6*7))"; echo "term=$TERM"; tty; id -un\n')
      await term.expect(/mark-42\r\n/, mark)
      await term.expect(/(^|[\r\n])24 80\r\n/, mark)
      await term.expect(/term=xterm-256color\r\n/, mark)
      await term.expect(/\/dev\/pts\/\d+\r\n/, mark)
      await term.expect(/(^|[\r\n])user\r\n/, mark)

      await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
      mark = term.text.length
      await term.send('stty size; echo "done-$((1+1))"\n')
      await term.expect(/(^|[\r\n])30 100\r\n[^]*done-2\r\n/, mark)

      // Ctrl-C interrupts the foreground job, the shell lives on.
      mark = term.text.length
      await term.send('echo "started-$((5*5))"; sleep 30; echo "not-$((2+2))"\n')
      await term.expect(/started-25\r\n/, mark)
      // Send Ctrl-C only once sleep runs (and so is the terminal's foreground job).
      await waitFor(async () => (await sbx.commands.run('pgrep -x sleep || true')).stdout.trim() !== '', {
        timeoutMs: 5_000,
        what: 'sleep 30 to start in the PTY',
      })
      await term.send('\x03')
      await term.send('echo "after-$((3+3))"\n')
      await term.expect(/after-6\r\n/, mark, 5_000)
      assert.ok(!/not-4/.test(term.text.slice(mark)), 'Ctrl-C did not interrupt sleep 30')
    } finally {
      killed = await sbx.pty.kill(term.pid)
    }
    assert.equal(killed, true, 'pty.kill reports the PTY was killed')
    await rejection(withTimeout(term.handle.wait(), 10_000, 'wait of a killed PTY'), 'wait of a killed PTY')
    await waitFor(async () => !(await sbx.commands.list()).some((p) => p.pid === term.pid), {
      timeoutMs: 5_000,
      what: 'the killed PTY to leave commands.list',
    })
    assert.equal(await sbx.pty.kill(term.pid), false, 'killing it again reports not found')
  })

  test('exit ends the session with its exit code', async () => {
    const term = await openPty({ cols: 120, rows: 40 })
    await term.send('stty size\n')
    await term.expect(/(^|[\r\n])40 120\r\n/)
    await term.send('exit 0\n')
    const r = await withTimeout(term.handle.wait(), 10_000, 'PTY shell to exit')
    assert.equal(r.exitCode, 0)
  })

  test('output written to the terminal streams progressively', async () => {
    const term = await openPty()
    try {
      const seen = []
      const mark = term.text.length
      await term.send('for i in 1 2 3; do echo "tick-$((i*10))"; sleep 0.4; done\n')
      for (const n of [10, 20, 30]) {
        await term.expect(new RegExp(`tick-${n}\\r\\n`), mark)
        seen.push(Date.now())
      }
      assert.ok(seen[2] - seen[0] >= 500, `ticks arrived together (${seen[2] - seen[0]} ms apart), not as produced`)
    } finally {
      await sbx.pty.kill(term.pid)
    }
  })
})
