// Starting a store's service from an app: `gem-resources serve` as a child
// of this process, bound to its life (the parent rule), and told apart
// from a store another service holds.

import { spawn } from 'node:child_process';
import readline from 'node:readline';

import { E_RESOURCE_SERVICE, ResourceError, serviceError } from './errors.js';

/** Another service holds the store (the code of `serve`'s error document). */
export const E_RESOURCE_BUSY = 'E_RESOURCE_BUSY';

/** How long `startService` waits for `serve`'s first line, in ms, unless told otherwise. */
export const START_TIMEOUT_MS = 30_000;

/** How much of `serve`'s standard error is kept for messages, in characters. */
const STDERR_TAIL = 4000;

/** The last lines of `text`, at most STDERR_TAIL characters. */
function tail(text) {
  const trimmed = text.trimEnd();
  return trimmed.length <= STDERR_TAIL ? trimmed : `…${trimmed.slice(-STDERR_TAIL)}`;
}

/**
 * The arguments of `serve` for `startService`'s options: the global
 * options, then `serve --parent-pid <this pid> --exit-with-stdin`.
 */
function serveArgs({ store, config, gems, args = [] }) {
  const out = [];
  if (config !== undefined) out.push('--config', config);
  if (store !== undefined) out.push('--store', store);
  out.push('--json', 'serve', '--parent-pid', String(process.pid), '--exit-with-stdin');
  if (gems !== undefined) out.push('--gems', gems);
  return out.concat(args);
}

/**
 * The error of `serve`'s error document (`{code, message, …}`, its first
 * line): code `E_RESOURCE_BUSY` with `pid`, the holder, when another
 * service holds the store; else the document's own code and message.
 * `stderr` is the tail of what it said on its standard error.
 */
function documentError(doc, stderr) {
  const error = new ResourceError(typeof doc.message === 'string' ? doc.message : `gem-resources serve failed (${doc.code})`, {
    code: typeof doc.code === 'string' ? doc.code : E_RESOURCE_SERVICE,
    primaryCause: doc.primary_cause,
    attempts: Array.isArray(doc.attempts) ? doc.attempts : [],
    data: doc,
  });
  if (error.code === E_RESOURCE_BUSY) {
    // The holder's pid is a field of the document; a service of an
    // earlier version said it only in its message.
    const pid = Number.isInteger(doc.pid) ? doc.pid : Number(/\(process (\d+)\)/.exec(error.message)?.[1]);
    error.pid = Number.isInteger(pid) && pid > 0 ? pid : undefined;
  }
  error.stderr = stderr;
  return error;
}

/**
 * Starts `gem-resources serve` on a store as a child of this process, as
 * an app does that runs the service of its store. Options: `bin` (the
 * program; default `gem-resources`, found on PATH), `store`, `config`
 * (a config.toml), `gems` (a gems folder `serve` keeps installed; none
 * for an app that installs through the API), `args` (more arguments of
 * `serve`), `env` (variables added to this process's environment),
 * `timeoutMs` (how long to wait for `serve` to listen; default
 * START_TIMEOUT_MS), `onEvent(event)` (each event `serve` prints after
 * `listening`).
 *
 * The service is bound to this process: it gets `--parent-pid` (this
 * process) and `--exit-with-stdin`, and its standard input is a pipe this
 * process holds open. When this process ends, however it ends (`kill -9`
 * too), the service stops as on SIGTERM, keeping what it downloaded.
 * Stop it sooner with `child.kill('SIGTERM')`.
 *
 * Resolves `{child, socket, pid, exited}` once it listens (`exited`: a
 * promise of `{code, signal}`). Rejects with a ResourceError: code
 * `E_RESOURCE_BUSY` and `pid` (the holder) when another service holds
 * the store, the service's own code and message for any other error it
 * reports (`stderr`: the tail of its standard error), or
 * E_RESOURCE_SERVICE when it could not be started or ended before saying
 * anything (the message names its exit status and stderr's tail).
 */
export function startService(options = {}) {
  const { bin = 'gem-resources', env, onEvent, timeoutMs = START_TIMEOUT_MS } = options;
  if (onEvent !== undefined && typeof onEvent !== 'function') throw new TypeError('startService(): onEvent must be a function');
  for (const name of ['store', 'config', 'gems']) {
    if (options[name] !== undefined && typeof options[name] !== 'string') {
      throw new TypeError(`startService(): ${name} must be a path`);
    }
  }
  if (options.args !== undefined && !(Array.isArray(options.args) && options.args.every((a) => typeof a === 'string'))) {
    throw new TypeError('startService(): args must be an array of strings');
  }
  const args = serveArgs(options);
  const what = `${bin} ${args.slice(0, args.indexOf('serve') + 1).join(' ')}`;
  return new Promise((resolve, reject) => {
    let child;
    try {
      child = spawn(bin, args, { stdio: ['pipe', 'pipe', 'pipe'], env: env === undefined ? process.env : { ...process.env, ...env } });
    } catch (e) {
      reject(serviceError(`cannot start ${what}: ${e.message}`, e));
      return;
    }
    let stderr = '';
    let settled = false;
    let timer;
    const settle = (f, value) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      f(value);
    };
    const fail = (error) => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      settle(reject, error);
    };
    // Its standard input stays open, unwritten, as long as this process
    // lives: its end is the service's signal to stop.
    child.stdin.on('error', () => {});
    child.stderr.setEncoding('utf8').on('data', (d) => {
      stderr = (stderr + d).slice(-4 * STDERR_TAIL);
    });
    const exited = new Promise((done) => child.once('exit', (code, signal) => done({ code, signal })));
    child.once('error', (e) => fail(serviceError(`cannot start ${what}: ${e.code ?? e.message}`, e)));
    timer = setTimeout(() => {
      fail(serviceError(`${what} did not listen within ${timeoutMs / 1000} s${stderr ? `; its stderr:\n${tail(stderr)}` : ''}`));
    }, timeoutMs);
    // Every line is read, so that its output never fills the pipe and
    // holds the service.
    const lines = readline.createInterface({ input: child.stdout });
    lines.on('line', (line) => {
      let doc;
      try {
        doc = JSON.parse(line);
      } catch {
        return;
      }
      if (doc === null || typeof doc !== 'object') return;
      if (settled) {
        onEvent?.(doc);
        return;
      }
      if (doc.event === 'listening') {
        settle(resolve, { child, socket: doc.socket, pid: doc.pid ?? child.pid, exited });
      } else if (doc.ok === false || typeof doc.code === 'string') {
        fail(documentError(doc, tail(stderr)));
      }
    });
    // Once its output is read to the end (a first line it printed before
    // exiting is seen first).
    child.once('close', (code, signal) => {
      fail(
        serviceError(
          `${what} exited (${signal ? `signal ${signal}` : `status ${code}`}) before it listened` +
            (stderr.trim() ? `; its stderr:\n${tail(stderr)}` : '; it said nothing on stderr'),
        ),
      );
    });
  });
}
