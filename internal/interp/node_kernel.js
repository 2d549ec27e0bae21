// nook's JavaScript kernel, run by nook-interp as `node -e <this>`.
// Requests arrive as JSON lines on fd 3 ({code, env}); events leave as
// JSON lines on fd 4 ({type: stdout|stderr|result|error|done, ...}).
// Cells are evaluated by a REPL server's own eval, which gives what Node's
// REPL has: state kept between cells, top-level await, and the value of
// the last expression as the result. SIGINT interrupts a running cell.
'use strict';
const fs = require('fs');
const repl = require('repl');
const util = require('util');
const { PassThrough } = require('stream');
const readline = require('readline');

const out = (ev) => {
  const line = JSON.stringify(ev) + '\n';
  let buf = Buffer.from(line);
  while (buf.length > 0) {
    try {
      const n = fs.writeSync(4, buf);
      buf = buf.subarray(n);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
};

const wrapWrite = (kind) => function (chunk, encoding, cb) {
  if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
  const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(encoding && encoding !== 'buffer' ? encoding : 'utf8');
  out({ type: kind, text });
  if (cb) process.nextTick(cb);
  return true;
};
process.stdout.write = wrapWrite('stdout');
process.stderr.write = wrapWrite('stderr');

const server = repl.start({
  prompt: '',
  input: new PassThrough(),
  output: new PassThrough(),
  terminal: false,
  useGlobal: false,
  ignoreUndefined: true,
  breakEvalOnSigint: true,
});
// The REPL gives its context a console writing to the REPL's output: use
// the process's (whose writes are streamed), also after a .clear.
const useConsole = () => { server.context.console = console; };
useConsole();
server.on('reset', useConsole);
// Interrupts: SIGUSR2 rejects an awaited promise (the REPL's own SIGINT
// handling); a synchronous loop, which keeps that handler from running,
// is broken by a SIGINT (breakEvalOnSigint). No SIGINT listener may be
// installed: it would defeat the REPL's SIGINT watchdog.
process.on('SIGUSR2', () => server.emit('SIGINT'));
process.on('uncaughtException', (e) => out({ type: 'stderr', text: 'Uncaught ' + (e && e.stack || String(e)) + '\n' }));
process.on('unhandledRejection', (e) => out({ type: 'stderr', text: 'Unhandled rejection: ' + (e && e.stack || String(e)) + '\n' }));

// A stack without the frames of the kernel itself.
const cellStack = (stack) => {
  const lines = String(stack).split('\n');
  const cut = lines.findIndex((l) => /sigintHandlersWrap|node:vm|node:repl|REPLServer|nook-kernel/.test(l));
  return (cut > 0 ? lines.slice(0, cut) : lines).join('\n');
};

const errorEvent = (e) => {
  if (e instanceof repl.Recoverable && e.err) e = e.err;
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    return { type: 'error', name: e.name || 'Error', value: e.message || String(e), traceback: cellStack(e.stack || String(e)) };
  }
  return { type: 'error', name: 'Error', value: util.inspect(e), traceback: 'Uncaught ' + util.inspect(e) };
};

let count = 0;
const queue = [];
let busy = false;

function setEnv(env) {
  const saved = {};
  for (const [k, v] of Object.entries(env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = v;
  }
  return () => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  };
}

// Errors a cell throws reach the REPL's domain, not the eval callback:
// take them over (the REPL would print them to its output).
let onCellError = null;
if (server._domain) {
  server._domain.removeAllListeners('error');
  server._domain.on('error', (e) => {
    if (onCellError) onCellError(e);
    else out({ type: 'stderr', text: 'Uncaught ' + (e && e.stack || String(e)) + '\n' });
  });
}

function next() {
  if (busy || queue.length === 0) return;
  busy = true;
  const req = queue.shift();
  const restore = setEnv(req.env);
  let finished = false;
  const finish = () => {
    if (finished) return;
    finished = true;
    onCellError = null;
    restore();
    out({ type: 'done', execution_count: count });
    busy = false;
    setImmediate(next);
  };
  count++;
  if (!req.code.trim()) { finish(); return; }
  onCellError = (e) => { out(errorEvent(e)); finish(); };
  try {
    server.eval(req.code, server.context, 'cell' + count + '.js', (err, result) => {
      try {
        if (err) {
          // The REPL marks incomplete input as recoverable: report the syntax error itself.
          out(errorEvent(err));
        } else if (result !== undefined) {
          out({ type: 'result', text: util.inspect(result, { depth: 4, colors: false, maxArrayLength: 200, maxStringLength: 100000 }) });
        }
      } finally {
        finish();
      }
    });
  } catch (e) {
    out(errorEvent(e));
    finish();
  }
}

const rl = readline.createInterface({ input: fs.createReadStream(null, { fd: 3 }), crlfDelay: Infinity });
rl.on('line', (line) => {
  if (!line) return;
  queue.push(JSON.parse(line));
  next();
});
rl.on('close', () => process.exit(0));
out({ type: 'ready' });
