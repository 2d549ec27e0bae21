// Shared helpers for the end-to-end tests. They talk to a live `nook serve`
// through the published e2b SDK; run.sh exports E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY, which the SDK picks up by itself.
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'

export const TEMPLATE = 'base'

// Sandboxes created by this process, so that a failing test never leaks one.
const created = new Set()

// createSandbox creates a sandbox and registers it for cleanup. With a test
// context the sandbox is killed when that test ends; killAll() (called from a
// file-level after hook) kills anything left.
export async function createSandbox(t, opts = {}, template = TEMPLATE) {
  const sbx = await Sandbox.create(template, { timeoutMs: 120_000, ...opts })
  created.add(sbx.sandboxId)
  if (t && typeof t.after === 'function') t.after(() => killQuietly(sbx.sandboxId))
  return sbx
}

export async function killQuietly(id) {
  created.delete(id)
  try {
    await Sandbox.kill(id, { requestTimeoutMs: 10_000 })
  } catch {
    // already gone
  }
}

export async function killAll() {
  await Promise.all([...created].map((id) => killQuietly(id)))
}

// A unique value, so that metadata filters and paths never collide with
// other tests or other runs on the same server.
export function unique(prefix = 'e2e') {
  return `${prefix}-${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`
}

export function sha256(data) {
  return createHash('sha256').update(data).digest('hex')
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// waitFor polls fn until it returns a truthy value or the deadline passes.
export async function waitFor(fn, { timeoutMs = 10_000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      last = await fn()
      if (last) return last
    } catch (e) {
      last = e
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`)
    }
    await sleep(intervalMs)
  }
}

// withTimeout rejects if p does not settle within ms, so a hung stream can
// never hang the suite.
export function withTimeout(p, ms, what = 'operation') {
  let timer
  return Promise.race([
    p,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms)
    }),
  ]).finally(() => clearTimeout(timer))
}

// rejection returns the error p rejects with, or fails if it resolves.
export async function rejection(p, what = 'operation') {
  let v
  try {
    v = await p
  } catch (e) {
    return e
  }
  throw new Error(`${what} unexpectedly succeeded: ${String(JSON.stringify(v)).slice(0, 300)}`)
}
