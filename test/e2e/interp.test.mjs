// The code interpreter (run_code on port 49999) through the published
// @e2b/code-interpreter SDK: Python on Jupyter, JavaScript, Bash, contexts,
// rich results, interrupts, env per execution and bad input.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { inflateSync } from 'node:zlib'
import { NotFoundError, Sandbox, SandboxError, TimeoutError } from '@e2b/code-interpreter'

const TEMPLATE = 'code-interpreter-v1'
let sbx

before(async () => {
  sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, envs: { SANDBOX_ONLY: 'sbx' } })
})
after(async () => {
  if (sbx) await sbx.kill().catch(() => {})
})

// decodePNG checks the PNG signature and IHDR and inflates its IDAT data,
// so a truncated or corrupt image fails.
function decodePNG(b64) {
  const buf = Buffer.from(b64, 'base64')
  assert.deepEqual([...buf.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'PNG signature')
  let off = 8
  let width = 0
  let height = 0
  const idat = []
  for (;;) {
    const len = buf.readUInt32BE(off)
    const type = buf.toString('latin1', off + 4, off + 8)
    const data = buf.subarray(off + 8, off + 8 + len)
    if (type === 'IHDR') {
      width = data.readUInt32BE(0)
      height = data.readUInt32BE(4)
    }
    if (type === 'IDAT') idat.push(data)
    off += 12 + len
    if (type === 'IEND') break
  }
  const raw = inflateSync(Buffer.concat(idat))
  assert.ok(raw.length > width * height, 'inflated image data')
  return { width, height }
}

// runCode leaves its request timer running when the answer is an HTTP
// error (SDK 2.8.0), which keeps node alive for requestTimeoutMs (60 s by
// default): calls expected to fail get a short one.
const failing = { requestTimeoutMs: 3000 }

async function rejection(p) {
  try {
    await p
  } catch (e) {
    return e
  }
  assert.fail('expected a rejection')
}

describe('code interpreter', { timeout: 240_000 }, () => {
  test('python: streamed stdout/stderr, main result, state across cells', async () => {
    const out = []
    const errs = []
    const results = []
    await sbx.runCode('x = 41')
    const ex = await sbx.runCode('import sys\nprint("hello")\nprint("warn", file=sys.stderr)\nx + 1', {
      onStdout: (m) => out.push(m.line),
      onStderr: (m) => errs.push(m.line),
      onResult: (r) => results.push(r),
    })
    assert.deepEqual(out, ['hello\n'])
    assert.deepEqual(errs, ['warn\n'])
    assert.equal(ex.text, '42')
    assert.equal(results.length, 1)
    assert.equal(results[0].isMainResult, true)
    assert.deepEqual(ex.logs, { stdout: ['hello\n'], stderr: ['warn\n'] })
    assert.equal(ex.error, undefined)
    assert.ok(ex.executionCount > 0)
  })

  test('python: an exception returns name, value and traceback', async () => {
    const errors = []
    const ex = await sbx.runCode('def f():\n    raise ValueError("bad value")\nf()', { onError: (e) => errors.push(e) })
    assert.equal(ex.error.name, 'ValueError')
    assert.equal(ex.error.value, 'bad value')
    assert.match(ex.error.traceback, /ValueError/)
    assert.match(ex.error.traceback, /f\(\)/)
    assert.equal(errors.length, 1)
    // The context still works after an error.
    assert.equal((await sbx.runCode('x')).text, '41')
  })

  test('python: matplotlib returns a PNG that decodes, and chart data', async () => {
    const ex = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9], label="a")\nplt.title("T")\nplt.xlabel("X")\nplt.show()',
    )
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    const img = ex.results.find((r) => r.png)
    assert.ok(img, `no png result in ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
    const { width, height } = decodePNG(img.png)
    assert.ok(width > 100 && height > 100, `${width}x${height}`)
    assert.equal(img.chart.type, 'line')
    assert.equal(img.chart.title, 'T')
    assert.equal(img.chart.x_label, 'X')
    assert.deepEqual(img.chart.elements[0].points, [[1, 4], [2, 1], [3, 9]])

    const bar = await sbx.runCode('plt.bar(["a", "b"], [3, 5])\nplt.show()')
    const chart = bar.results.find((r) => r.chart)?.chart
    assert.equal(chart?.type, 'bar')
    assert.deepEqual(chart.elements.map((e) => [e.label, e.value]), [['a', 3], ['b', 5]])

    const pie = await sbx.runCode('plt.pie([1, 3], labels=["x", "y"])\nplt.show()')
    const pc = pie.results.find((r) => r.chart)?.chart
    assert.equal(pc?.type, 'pie')
    assert.deepEqual(pc.elements.map((e) => [e.label, Math.round(e.angle)]), [['x', 90], ['y', 270]])

    const sc = await sbx.runCode('plt.scatter([1, 2], [3, 4])\nplt.show()')
    assert.equal(sc.results.find((r) => r.chart)?.chart?.type, 'scatter')
  })

  test('python: a pandas DataFrame returns HTML and data', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    const r = ex.results[0]
    assert.equal(r.isMainResult, true)
    assert.match(r.html, /<table/)
    assert.match(r.text, /a\s+b/)
    assert.deepEqual(r.data.columns, ['a', 'b'])
    assert.deepEqual(r.data.data, [[1, 'x'], [2, 'y']])
  })

  test('run_code sees the image env, not the sandbox env; envs apply to one execution', async () => {
    const ex = await sbx.runCode('import os\n(os.environ.get("PATH") is not None, os.environ.get("SANDBOX_ONLY"))')
    assert.equal(ex.text, '(True, None)')
    const withEnv = await sbx.runCode('import os\nos.environ["E2E_VAR"]', { envs: { E2E_VAR: 'once' } })
    assert.equal(withEnv.text, "'once'")
    const afterwards = await sbx.runCode('os.environ.get("E2E_VAR")')
    assert.equal(afterwards.text, undefined) // None has no main result
    const js = await sbx.runCode('process.env.E2E_VAR', { language: 'javascript', envs: { E2E_VAR: 'js' } })
    assert.equal(js.text, "'js'")
    const sh = await sbx.runCode('echo "$E2E_VAR"', { language: 'bash', envs: { E2E_VAR: 'sh' } })
    assert.deepEqual(sh.logs.stdout, ['sh\n'])
    const sh2 = await sbx.runCode('echo "${E2E_VAR-unset}"', { language: 'bash' })
    assert.deepEqual(sh2.logs.stdout, ['unset\n'])
  })

  test('javascript: state, console output, top-level await, last expression', async () => {
    await sbx.runCode('let n = 20; const double = (v) => v * 2', { language: 'javascript' })
    const out = []
    const ex = await sbx.runCode('console.log("from js"); await new Promise((r) => setTimeout(r, 50)); double(n) + 2', {
      language: 'js',
      onStdout: (m) => out.push(m.line),
    })
    assert.deepEqual(out, ['from js\n'])
    assert.equal(ex.text, '42')
    const err = await sbx.runCode('null.x', { language: 'javascript' })
    assert.equal(err.error.name, 'TypeError')
  })

  test('bash: state across cells, stderr, exit status as error', async () => {
    await sbx.runCode('COUNT=3; greet() { echo "hi $1"; }', { language: 'bash' })
    const ex = await sbx.runCode('greet $COUNT; echo oops >&2', { language: 'bash' })
    assert.deepEqual(ex.logs.stdout, ['hi 3\n'])
    assert.deepEqual(ex.logs.stderr, ['oops\n'])
    const bad = await sbx.runCode('false', { language: 'bash' })
    assert.equal(bad.error.value, '1')
  })

  test('contexts: create, cwd, list, restart, delete', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
    assert.equal(ctx.cwd, '/tmp')
    assert.equal(ctx.language, 'python')
    const cwd = await sbx.runCode('import os\nos.getcwd()', { context: ctx })
    assert.equal(cwd.text, "'/tmp'")
    await sbx.runCode('y = 7', { context: ctx })
    // Contexts are separate: the default one has no y.
    const other = await sbx.runCode('y')
    assert.equal(other.error?.name, 'NameError')
    assert.equal((await sbx.runCode('y', { context: ctx })).text, '7')
    const list = await sbx.listCodeContexts()
    assert.ok(list.some((c) => c.id === ctx.id && c.cwd === '/tmp'))
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('y', { context: ctx })).error?.name, 'NameError')
    const js = await sbx.createCodeContext({ language: 'javascript' })
    assert.equal((await sbx.runCode('1 + 1', { context: js })).text, '2')
    await sbx.removeCodeContext(ctx)
    await sbx.removeCodeContext(js.id)
    const after = await sbx.listCodeContexts()
    assert.ok(!after.some((c) => c.id === ctx.id || c.id === js.id))
    assert.ok((await rejection(sbx.runCode('1', { context: ctx, ...failing }))) instanceof NotFoundError)
  })

  test('contexts run concurrently; cells on one context run in order', async () => {
    const a = await sbx.createCodeContext()
    const b = await sbx.createCodeContext()
    // Both cells report when they ran: the intervals overlap.
    const cell = 'import time\nt0 = time.time()\ntime.sleep(1.5)\n[t0, time.time()]'
    const [ra, rb] = await Promise.all([sbx.runCode(cell, { context: a }), sbx.runCode(cell, { context: b })])
    const [a0, a1] = JSON.parse(ra.text)
    const [b0, b1] = JSON.parse(rb.text)
    assert.ok(a0 < b1 && b0 < a1, `contexts ran one after the other: ${ra.text} ${rb.text}`)
    // Cells sent while an earlier one runs on the same context wait and
    // run in the order they arrived (sent 150 ms apart).
    const order = await Promise.all([1, 2, 3].map(async (i) => {
      await new Promise((r) => setTimeout(r, 150 * (i - 1)))
      return sbx.runCode(`import time\ntime.sleep(0.${4 - i})\nseen = globals().get("seen", []) + [${i}]\nseen`, { context: a })
    }))
    assert.equal(order[2].text, '[1, 2, 3]')
    await sbx.removeCodeContext(a)
    await sbx.removeCodeContext(b)
  })

  test('a timed-out `while True` is interrupted and the context still works', async () => {
    const ctx = await sbx.createCodeContext()
    await sbx.runCode('kept = "state"', { context: ctx })
    const err = await rejection(sbx.runCode('while True:\n    pass', { context: ctx, timeoutMs: 1500 }))
    assert.ok(err instanceof TimeoutError, `${err?.constructor?.name}: ${err?.message}`)
    const t0 = Date.now()
    const ex = await sbx.runCode('kept', { context: ctx })
    assert.equal(ex.text, "'state'")
    assert.ok(Date.now() - t0 < 5000, `next cell waited ${Date.now() - t0} ms`)
    // The same for JavaScript and Bash.
    const js = await sbx.createCodeContext({ language: 'javascript' })
    await sbx.runCode('const keptJs = 5', { context: js })
    assert.ok((await rejection(sbx.runCode('while (true) {}', { context: js, timeoutMs: 1500 }))) instanceof TimeoutError)
    assert.equal((await sbx.runCode('keptJs', { context: js })).text, '5')
    await sbx.removeCodeContext(ctx)
    await sbx.removeCodeContext(js)
  })

  test('bad input: unknown language, unknown context, context with language, empty code, 10 MB cell', async () => {
    const lang = await rejection(sbx.runCode('1', { language: 'cobol', ...failing }))
    assert.ok(lang instanceof SandboxError && /400/.test(lang.message), lang.message)
    const ctx = await rejection(sbx.runCode('1', { context: { id: 'nope', language: 'python', cwd: '/' }, ...failing }))
    assert.ok(ctx instanceof NotFoundError, ctx.message)
    const both = await rejection(sbx.runCode('1', { context: { id: 'x' }, language: 'python' }))
    assert.ok(both instanceof SandboxError)
    const res = await fetch(`${process.env.E2B_SANDBOX_URL}/execute`, {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json' },
      body: JSON.stringify({ code: '1', context_id: 'abc', language: 'python' }),
    })
    assert.equal(res.status, 400)
    const body = await res.json()
    assert.equal(body.code, 400)
    assert.match(body.message, /context_id or language/)

    const empty = await sbx.runCode('')
    assert.equal(empty.error, undefined)
    assert.deepEqual(empty.results, [])

    const big = await rejection(sbx.runCode(`s = "${'a'.repeat(10 << 20)}"`, { requestTimeoutMs: 20_000 }))
    assert.ok(big instanceof SandboxError && /413/.test(big.message), big.message)
    // Nothing broke.
    assert.equal((await sbx.runCode('x')).text, '41')
  })

  test('a kernel killed from a shell is reported, then restarted', async () => {
    const ctx = await sbx.createCodeContext()
    await sbx.runCode('z = 1', { context: ctx })
    const pid = (await sbx.runCode('import os\nos.getpid()', { context: ctx })).text
    await sbx.commands.run(`kill -9 ${pid}`)
    const dead = await sbx.runCode('z', { context: ctx })
    assert.equal(dead.error?.name, 'DeadKernelError')
    assert.match(dead.error.value, /restarted/)
    const again = await sbx.runCode('z = 2\nz', { context: ctx })
    assert.equal(again.text, '2')
    // A kernel that dies during a cell reports it in that cell.
    const during = await sbx.runCode('import os, signal\nos.kill(os.getpid(), signal.SIGKILL)', { context: ctx })
    assert.equal(during.error?.name, 'DeadKernelError')
    assert.equal((await sbx.runCode('1 + 1', { context: ctx })).text, '2')
    await sbx.removeCodeContext(ctx)
  })
})
