// Filesystem through the published e2b SDK: read/write, a large binary
// round trip, directory operations, entry info, watching and errors.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { FilesystemEventType, NotFoundError } from 'e2b'
import { createSandbox, killAll, rejection, sha256, waitFor } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await createSandbox(null, { timeoutMs: 300_000 })
})
after(killAll)

const sh = async (cmd, opts) => (await sbx.commands.run(cmd, opts)).stdout

describe('files', { timeout: 120_000 }, () => {
  test('write and read text', async () => {
    const text = 'héllo wörld 😀\nsecond line\n'
    const info = await sbx.files.write('/home/user/hello.txt', text)
    assert.equal(info.name, 'hello.txt')
    assert.equal(info.path, '/home/user/hello.txt')
    assert.equal(info.type, 'file')
    assert.equal(await sbx.files.read('/home/user/hello.txt'), text)
    assert.equal(await sh('cat /home/user/hello.txt'), text)
    // Written as the default user.
    assert.equal(await sh('stat -c %U:%G /home/user/hello.txt'), 'user:user\n')

    // Overwrite replaces the content.
    await sbx.files.write('/home/user/hello.txt', 'short')
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'short')

    // Empty file.
    await sbx.files.write('/home/user/empty.txt', '')
    assert.equal(await sbx.files.read('/home/user/empty.txt'), '')
    assert.equal(await sh('stat -c %s /home/user/empty.txt'), '0\n')

    // A file written by a command reads back, as text and as bytes.
    await sh('printf "from\\tbash\\n" > /home/user/bash.txt')
    assert.equal(await sbx.files.read('/home/user/bash.txt'), 'from\tbash\n')
    const bytes = await sbx.files.read('/home/user/bash.txt', { format: 'bytes' })
    assert.deepEqual(Buffer.from(bytes), Buffer.from('from\tbash\n'))

    // Writing into a directory that does not exist yet creates it.
    await sbx.files.write('/home/user/new/deep/dir/f.txt', 'deep')
    assert.equal(await sh('cat /home/user/new/deep/dir/f.txt; echo; stat -c %U /home/user/new/deep'), 'deep\nuser\n')

    // Several files at once.
    const infos = await sbx.files.write([
      { path: '/home/user/multi/a.txt', data: 'A' },
      { path: '/home/user/multi/b.txt', data: 'B' },
    ])
    assert.deepEqual(infos.map((i) => i.path).sort(), ['/home/user/multi/a.txt', '/home/user/multi/b.txt'])
    assert.equal(await sh('cat /home/user/multi/a.txt /home/user/multi/b.txt'), 'AB')
  })

  test('user option for files: ownership follows the user', async () => {
    // Like E2B's envd, files are written for the requested user: owned by it.
    await sbx.files.write('/tmp/owned-by-root.txt', 'root data', { user: 'root' })
    await sbx.files.write('/tmp/owned-by-user.txt', 'user data')
    assert.equal(await sh('stat -c %U:%G /tmp/owned-by-root.txt /tmp/owned-by-user.txt'), 'root:root\nuser:user\n')
    assert.equal(await sbx.files.read('/tmp/owned-by-root.txt', { user: 'root' }), 'root data')
    assert.equal((await sbx.files.getInfo('/tmp/owned-by-root.txt', { user: 'root' })).owner, 'root')
    await sbx.files.makeDir('/tmp/dir-of-root', { user: 'root' })
    assert.equal(await sh('stat -c %U /tmp/dir-of-root'), 'root\n')
    // Relative paths follow the user's home.
    await sbx.files.write('in-root-home.txt', 'r', { user: 'root' })
    assert.equal(await sh('cat /root/in-root-home.txt', { user: 'root' }), 'r')
  })

  test('50 MB random binary round trip is byte-exact', { timeout: 90_000 }, async () => {
    const size = 50 * 1024 * 1024
    const data = randomBytes(size)
    const want = sha256(data)

    const info = await sbx.files.write('/home/user/big.bin', new Blob([data]), { requestTimeoutMs: 60_000 })
    assert.equal(info.path, '/home/user/big.bin')
    assert.equal(await sh('stat -c %s /home/user/big.bin'), `${size}\n`)
    assert.equal((await sh('sha256sum /home/user/big.bin', { timeoutMs: 30_000 })).split(' ')[0], want, 'sha256 in the sandbox')
    assert.equal((await sbx.files.getInfo('/home/user/big.bin')).size, size)

    const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes', requestTimeoutMs: 60_000 })
    assert.equal(back.length, size)
    assert.equal(sha256(back), want, 'sha256 of the bytes read back')
    await sbx.files.remove('/home/user/big.bin')
  })

  test('makeDir, list, exists, rename, remove, getInfo', async () => {
    const root = '/home/user/tree'
    assert.equal(await sbx.files.exists(root), false)
    assert.equal(await sbx.files.makeDir(root), true)
    assert.equal(await sbx.files.makeDir(root), false, 'makeDir of an existing directory reports false')
    assert.equal(await sbx.files.exists(root), true)
    assert.equal(await sbx.files.makeDir(`${root}/sub/deeper`), true, 'makeDir creates parents')

    await sbx.files.write(`${root}/a.txt`, 'aaa')
    await sbx.files.write(`${root}/b.bin`, new Blob([new Uint8Array([0, 1, 2, 255])]))
    await sbx.files.write(`${root}/sub/inner.txt`, 'inner')

    const entries = await sbx.files.list(root)
    assert.deepEqual(
      entries.map((e) => [e.name, e.type, e.path]).sort(),
      [
        ['a.txt', 'file', `${root}/a.txt`],
        ['b.bin', 'file', `${root}/b.bin`],
        ['sub', 'dir', `${root}/sub`],
      ],
    )
    const a = entries.find((e) => e.name === 'a.txt')
    assert.equal(a.size, 3)
    assert.equal(entries.find((e) => e.name === 'b.bin').size, 4)

    const deep = await sbx.files.list(root, { depth: 2 })
    assert.deepEqual(
      deep.map((e) => e.path).sort(),
      [`${root}/a.txt`, `${root}/b.bin`, `${root}/sub`, `${root}/sub/deeper`, `${root}/sub/inner.txt`],
    )

    // getInfo of a file and of a directory.
    const before = Date.now()
    await sbx.files.write(`${root}/info.txt`, 'twelve bytes')
    const fi = await sbx.files.getInfo(`${root}/info.txt`)
    assert.equal(fi.name, 'info.txt')
    assert.equal(fi.path, `${root}/info.txt`)
    assert.equal(fi.type, 'file')
    assert.equal(fi.size, 12)
    assert.equal(fi.owner, 'user')
    assert.equal(fi.group, 'user')
    assert.equal(fi.permissions, '-rw-r--r--')
    assert.equal(fi.mode & 0o777, 0o644)
    assert.ok(fi.modifiedTime instanceof Date)
    assert.ok(Math.abs(fi.modifiedTime.getTime() - before) < 10_000, `modifiedTime ${fi.modifiedTime.toISOString()} is not recent`)
    const di = await sbx.files.getInfo(`${root}/sub`)
    assert.equal(di.type, 'dir')
    assert.equal(di.name, 'sub')
    assert.equal(di.permissions, 'drwxr-xr-x')
    await sh(`chmod 600 ${root}/info.txt; ln -s info.txt ${root}/link`)
    assert.equal((await sbx.files.getInfo(`${root}/info.txt`)).permissions, '-rw-------')
    assert.equal((await sbx.files.getInfo(`${root}/link`)).symlinkTarget, `${root}/info.txt`)

    // rename a file and a directory.
    const moved = await sbx.files.rename(`${root}/a.txt`, `${root}/sub/a-moved.txt`)
    assert.equal(moved.path, `${root}/sub/a-moved.txt`)
    assert.equal(moved.name, 'a-moved.txt')
    assert.equal(await sbx.files.exists(`${root}/a.txt`), false)
    assert.equal(await sbx.files.read(`${root}/sub/a-moved.txt`), 'aaa')
    await sbx.files.rename(`${root}/sub`, `${root}/sub2`)
    assert.equal(await sbx.files.read(`${root}/sub2/inner.txt`), 'inner')
    assert.equal(await sbx.files.exists(`${root}/sub`), false)

    // remove a file, then a non-empty directory.
    await sbx.files.remove(`${root}/b.bin`)
    assert.equal(await sbx.files.exists(`${root}/b.bin`), false)
    await sbx.files.remove(`${root}/sub2`)
    assert.equal(await sbx.files.exists(`${root}/sub2`), false)
    assert.equal(await sh(`ls -A ${root} | sort | tr '\\n' ' '`), 'info.txt link ')
  })

  test('relative paths are relative to the user home', async () => {
    await sbx.files.write('relative.txt', 'rel')
    assert.equal(await sh('cat /home/user/relative.txt'), 'rel')
    assert.equal(await sbx.files.read('relative.txt'), 'rel')
    assert.equal(await sbx.files.exists('relative.txt'), true)
  })

  test('watchDir sees files created by a command', async () => {
    const dir = '/home/user/watched'
    await sbx.files.makeDir(dir)
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e), { timeoutMs: 30_000 })
    try {
      await sh(`echo hi > ${dir}/new.txt; mkdir ${dir}/subdir; mv ${dir}/new.txt ${dir}/renamed.txt; rm ${dir}/renamed.txt`)
      const has = (name, type) => events.some((e) => e.name === name && e.type === type)
      await waitFor(() => has('renamed.txt', FilesystemEventType.REMOVE), { timeoutMs: 5_000, what: `watch events (got ${JSON.stringify(events)})` })
      assert.ok(has('new.txt', FilesystemEventType.CREATE), `no create of new.txt in ${JSON.stringify(events)}`)
      assert.ok(has('new.txt', FilesystemEventType.WRITE), `no write of new.txt in ${JSON.stringify(events)}`)
      assert.ok(has('subdir', FilesystemEventType.CREATE), `no create of subdir in ${JSON.stringify(events)}`)
      assert.ok(has('new.txt', FilesystemEventType.RENAME), `no rename of new.txt in ${JSON.stringify(events)}`)
      assert.ok(has('renamed.txt', FilesystemEventType.CREATE), `no create of renamed.txt in ${JSON.stringify(events)}`)
      // Non-recursive: nothing from inside subdir.
      const n = events.length
      await sh(`touch ${dir}/subdir/inside.txt; touch ${dir}/marker`)
      await waitFor(() => has('marker', FilesystemEventType.CREATE), { timeoutMs: 5_000, what: 'marker event' })
      assert.ok(!events.slice(n).some((e) => e.name.includes('inside')), `non-recursive watch reported ${JSON.stringify(events.slice(n))}`)
    } finally {
      await handle.stop()
    }
    // After stop no more events arrive.
    const n = events.length
    await sh(`touch ${dir}/after-stop`)
    await new Promise((r) => setTimeout(r, 300))
    assert.equal(events.length, n, `events after stop: ${JSON.stringify(events.slice(n))}`)
  })

  test('recursive watchDir sees nested files', async () => {
    const dir = '/home/user/watched-r'
    await sbx.files.makeDir(`${dir}/a/b`)
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e), { recursive: true, timeoutMs: 30_000 })
    try {
      await sh(`echo x > ${dir}/a/b/nested.txt`)
      await waitFor(() => events.some((e) => e.name === 'a/b/nested.txt' && e.type === FilesystemEventType.CREATE), {
        timeoutMs: 5_000,
        what: `recursive watch event for a/b/nested.txt (got ${JSON.stringify(events)})`,
      })
    } finally {
      await handle.stop()
    }
  })

  test('missing paths are NotFound', async () => {
    const missing = '/home/user/nook-e2e-missing.txt'
    const read = await rejection(sbx.files.read(missing), 'read missing')
    assert.ok(read instanceof NotFoundError, `read: expected NotFoundError, got ${read?.constructor?.name}: ${read?.message}`)
    const info = await rejection(sbx.files.getInfo(missing), 'getInfo missing')
    assert.ok(info instanceof NotFoundError, `getInfo: expected NotFoundError, got ${info?.constructor?.name}: ${info?.message}`)
    const list = await rejection(sbx.files.list('/home/user/nook-e2e-missing-dir'), 'list missing')
    assert.ok(list instanceof NotFoundError, `list: expected NotFoundError, got ${list?.constructor?.name}: ${list?.message}`)
    const mv = await rejection(sbx.files.rename(missing, '/home/user/x'), 'rename missing')
    assert.ok(mv instanceof NotFoundError, `rename: expected NotFoundError, got ${mv?.constructor?.name}: ${mv?.message}`)
    const w = await rejection(sbx.files.watchDir('/home/user/nook-e2e-missing-dir', () => {}), 'watch missing')
    assert.ok(w instanceof NotFoundError, `watchDir: expected NotFoundError, got ${w?.constructor?.name}: ${w?.message}`)
    assert.equal(await sbx.files.exists(missing), false)
  })
})
