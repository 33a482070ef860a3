// Client of the gem-resources service's local API, protocol 1 (PROTOCOL.md
// at the root of the repository is the contract).
//
// One JSON-RPC 2.0 message per line over a Unix domain socket (a named pipe
// on Windows). Answers are matched to requests by id, whatever their order.
// Each subscription gets a connection of its own: its events are its alone,
// and a page that reads them slowly never delays the answers of the client.
//
// A client never sends a byte to a service that is not its own user's,
// holding this store: before each connection it checks that the socket and
// its folder are the user's own, and the first message is `hello` with a
// random nonce, which the service must answer with the proof that it holds
// the secret of the store's service.json (see "How the client knows its
// service" in README.md). Every new connection is checked so, against the
// service.json of that moment: after the service restarts, the client checks
// the new service (its pid, its secret) before it sends it anything else.
//
// When the service goes away (it stopped, or was killed), a client of a store
// looks for the next one for a while (`reconnect`) and says so
// ('disconnected', 'reconnected'); its subscriptions subscribe again. A call
// the service did not answer before it went rejects with E_RESOURCE_SERVICE
// (see "When the service restarts" in README.md).

import crypto from 'node:crypto';
import { EventEmitter } from 'node:events';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** The protocol this client speaks. */
export const PROTOCOL = 1;

/** The connection to the service failed or closed (a client-side code). */
export const E_RESOURCE_SERVICE = 'E_RESOURCE_SERVICE';
/** A subscription fell behind and was ended by the service. */
export const E_RESOURCE_LAGGED = 'E_RESOURCE_LAGGED';
/** A call was cancelled: by its AbortSignal, or by `$/cancelRequest`. */
export const E_RESOURCE_CANCELLED = 'E_RESOURCE_CANCELLED';

/** The methods whose call the service cancels on `$/cancelRequest`. */
const CANCELLABLE = new Set(['path', 'autofill']);

/** How long an aborted call waits for the service's answer to its
 * `$/cancelRequest` (ms), for `error.downloadOutcome`. */
export const CANCEL_ANSWER_MS = 5000;

/** Events a subscription holds before it stops reading its socket; the
 * service then queues for it, and past its own limit sends `lagged`. */
const SUBSCRIPTION_BUFFER = 256;

/** The longest line this client reads from a service, in characters (each
 * at least one byte): past it the connection fails, rather than the
 * client's memory growing without bound. */
export const MAX_LINE_FROM_SERVICE = 64 * 1024 * 1024;

/** How long `hello` may take to be answered on a new connection (ms): a
 * service that accepts and never answers does not hold a caller for ever. */
export const HELLO_TIMEOUT_MS = 5000;

/** How long a call that does not wait for a transfer (every method but
 * `path` and `autofill`) waits for its answer, in ms, unless `connect`'s
 * `answerTimeoutMs` says otherwise; then it rejects with
 * E_RESOURCE_SERVICE: a service that stopped answering never holds a
 * caller for ever. */
export const ANSWER_TIMEOUT_MS = 30_000;

/** Methods that wait for a transfer, as long as it runs: no answer timeout. */
const WAITS_FOR_TRANSFER = new Set(['path', 'autofill']);

/**
 * How long a client of a store looks for a new service after it lost its
 * own, in ms, unless `connect`'s `reconnect` says otherwise: calls wait for
 * it that long at most, and so does a subscription before it ends.
 */
export const RECONNECT_MS = 30_000;

/** The first pause between two tries to reach a service (ms); it doubles up to RETRY_MAX_MS. */
const RETRY_FIRST_MS = 50;
const RETRY_MAX_MS = 1000;

/**
 * How long the service that closed a client's connection must go on
 * running (its service.json in place, the new connection open) to be taken
 * for one that closed it on purpose, rather than one that is stopping (ms).
 */
const STILL_RUNS_MS = 200;

/**
 * Calls that change nothing on the service: one cut off by the service
 * going away can simply be made again. Any other (`install`, `set_policy`,
 * `cancel`, …) may or may not have been done, and its error says so.
 */
const SAFE_AGAIN = new Set(['hello', 'status', 'path', 'policy', 'autofill']);

/** Marks an error of a connection lost with the service (not closed by the client, nor broken by the service). */
const LOST = Symbol('lost');
/** Marks the end of a client or subscription that reconnecting cannot mend. */
const FINAL = Symbol('final');

/** `connection.request('hello', params)`, failed (E_RESOURCE_SERVICE) and
 * the connection closed when no answer comes within HELLO_TIMEOUT_MS. */
function helloWithin(connection, params, where) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const error = serviceError(`${where} did not answer hello within ${HELLO_TIMEOUT_MS / 1000} s`);
      connection.fail(error);
      reject(error);
    }, HELLO_TIMEOUT_MS);
  });
  return Promise.race([connection.request('hello', params), late]).finally(() => clearTimeout(timer));
}

/** What a service's `hello` proof is an HMAC of, followed by the nonce. */
const HELLO_CONTEXT = 'gem-resources hello\n';

/**
 * An error of the service (a JSON-RPC error answer) or of the connection to
 * it. `code` is the library's stable code (`E_RESOURCE_UNAVAILABLE`, …, or
 * `E_RESOURCE_SERVICE` for the connection itself), `primaryCause` the most
 * specific code among the attempts (`E_RESOURCE_POLICY` when the network
 * policy refused an address), `attempts` each address with its own code and
 * reason, `data` the whole error object, `rpcCode` the JSON-RPC code
 * (`-32000` for every error of the library; absent for connection errors).
 */
export class ResourceError extends Error {
  constructor(message, { code, primaryCause, attempts, data, rpcCode } = {}) {
    super(message);
    this.name = 'ResourceError';
    this.code = code ?? E_RESOURCE_SERVICE;
    this.primaryCause = primaryCause ?? this.code;
    this.attempts = attempts ?? [];
    this.data = data;
    this.rpcCode = rpcCode;
    if (typeof data?.download === 'string') this.download = data.download;
  }

  /** The error of a JSON-RPC error object. */
  static fromRpc(error) {
    const data = error && typeof error.data === 'object' && error.data !== null ? error.data : undefined;
    const message = (data && typeof data.message === 'string' && data.message) ||
      (error && typeof error.message === 'string' && error.message) ||
      'the service answered with an error';
    return new ResourceError(message, {
      code: data?.code ?? rpcCodeName(error?.code),
      primaryCause: data?.primary_cause,
      attempts: Array.isArray(data?.attempts) ? data.attempts : [],
      data,
      rpcCode: error?.code,
    });
  }
}

/** A code for an error answer that carries no `data`. */
function rpcCodeName(rpcCode) {
  switch (rpcCode) {
    case -32602:
      return 'E_RESOURCE_USAGE';
    case -32800:
      return E_RESOURCE_CANCELLED;
    default:
      return E_RESOURCE_SERVICE;
  }
}

/**
 * The error a call rejects with when its AbortSignal aborts: code
 * E_RESOURCE_CANCELLED, `aborted: true`, `cause` the signal's reason,
 * `download` once the service said what became of the download, and
 * `downloadOutcome`, a promise of it (`'unknown'` when it will not be
 * told). Returns `[error, settle]`: `settle(download)` fills both, once.
 */
function abortError(method, reason, sent) {
  const error = new ResourceError(
    sent
      ? `the call \`${method}\` was cancelled by its AbortSignal`
      : `the call \`${method}\` was not sent: its AbortSignal was aborted first`,
    { code: E_RESOURCE_CANCELLED },
  );
  error.aborted = true;
  error.cause = reason;
  error.download = undefined;
  let resolve;
  error.downloadOutcome = new Promise((r) => {
    resolve = r;
  });
  const settle = (download) => {
    if (resolve === undefined) return;
    if (download !== 'unknown') error.download = download;
    resolve(download);
    resolve = undefined;
  };
  return [error, settle];
}

function serviceError(message, cause) {
  const error = new ResourceError(message, { code: E_RESOURCE_SERVICE });
  if (cause !== undefined) error.cause = cause;
  return error;
}

/** `<store>/store-v1`: the folder that holds the store's layout. */
export function storeLayout(store) {
  return path.join(store, 'store-v1');
}

/**
 * What `<store>/store-v1/service.json` says about the service listening on
 * `store`: `{protocol, socket, pid, version}`, or null when no service has
 * written one. A file left by a service killed with `kill -9` names a socket
 * that refuses connections; `connect` says so. The file's `secret` is not
 * handed out: only `connect` uses it, to check the service's `hello`.
 */
export async function findService(store) {
  const info = await readServiceFile(store);
  if (info === null) return null;
  const { secret, ...rest } = info;
  return rest;
}

/** The whole of service.json, `secret` included, or null when there is none. */
async function readServiceFile(store) {
  const file = path.join(storeLayout(store), 'service.json');
  let text;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (e) {
    if (e && (e.code === 'ENOENT' || e.code === 'ENOTDIR')) return null;
    throw serviceError(`cannot read ${file}: ${e.message}`, e);
  }
  let info;
  try {
    info = JSON.parse(text);
  } catch (e) {
    throw serviceError(`${file} is not JSON: ${e.message}`, e);
  }
  if (!info || typeof info !== 'object' || typeof info.socket !== 'string') {
    throw serviceError(`${file} names no socket`);
  }
  return info;
}

/**
 * What `connect` was given, checked: `{store}` or `{socket}`,
 * `answerTimeoutMs`, `wait` and `reconnect` (ms), and `name`, how messages
 * name the service ("Notes's resource service" with `appName: 'Notes'`).
 */
function settingsOf(options) {
  const { store, socket, appName } = options;
  if (typeof socket !== 'string' && typeof store !== 'string') {
    throw new TypeError('connect() needs {store} or {socket}');
  }
  const ms = (name, value, positive) => {
    if (!(Number.isFinite(value) && (positive ? value > 0 : value >= 0))) {
      throw new TypeError(`connect(): ${name} must be a ${positive ? 'positive' : 'non-negative'} number of milliseconds`);
    }
    return value;
  };
  if (appName !== undefined && (typeof appName !== 'string' || appName.trim() === '')) {
    throw new TypeError('connect(): appName must be a non-empty string');
  }
  return {
    store: typeof socket === 'string' ? undefined : store,
    socket: typeof socket === 'string' ? socket : undefined,
    answerTimeoutMs: ms('answerTimeoutMs', options.answerTimeoutMs ?? ANSWER_TIMEOUT_MS, true),
    wait: ms('wait', options.wait ?? 0, false),
    reconnect: options.reconnect === false ? 0 : ms('reconnect', options.reconnect ?? RECONNECT_MS, false),
    appName,
    name: appName === undefined ? 'the resource service' : `${appName}'s resource service`,
  };
}

/** `text` with its first letter in capitals. */
function capitalized(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** Milliseconds as seconds, for messages: `1.5`, `30`. */
function seconds(ms) {
  return String(Math.round(ms / 100) / 10);
}

/**
 * The service `settings` name at this moment: `{socket, where,
 * fromServiceFile, secret, pid, settings}`, read anew from service.json
 * through a store; an E_RESOURCE_SERVICE error when the store has none.
 */
async function targetOf(settings) {
  if (settings.socket !== undefined) {
    return { socket: settings.socket, where: `socket ${settings.socket}`, fromServiceFile: false, secret: null, pid: null, settings };
  }
  const { store } = settings;
  const info = await readServiceFile(store);
  if (info === null) {
    // Said for whoever uses the tool: the app (or `gem-resources serve`)
    // runs the service, not the tool.
    const file = path.join(storeLayout(store), 'service.json');
    throw serviceError(
      settings.appName === undefined
        ? `${capitalized(settings.name)} is not running: nothing listens on the store ${store} ` +
            `(no ${file}; the app that uses this store starts it, or \`gem-resources serve\`)`
        : `${capitalized(settings.name)} is not running: start ${settings.appName} ` +
            `(nothing listens on the store ${store}: no ${file})`,
    );
  }
  return {
    socket: info.socket,
    where: `the service of the store ${store} (socket ${info.socket}, pid ${info.pid})`,
    fromServiceFile: true,
    secret: info.secret,
    pid: info.pid,
    settings,
  };
}

/**
 * A new connection to `target`, checked as every connection is (see
 * `open`, `proveService`): `{connection, hello}`. With `hello: false`, a
 * socket given directly gets no `hello` (a subscription's connection).
 */
async function dial(target, { hello = true } = {}) {
  const socket = await open(target);
  const connection = new Connection(socket, target.where, () => {}, target.settings.answerTimeoutMs);
  if (!hello && !target.fromServiceFile) return { connection, hello: null };
  try {
    const answer = target.fromServiceFile
      ? await proveService(connection, target)
      : await helloWithin(connection, undefined, target.where);
    if (answer?.protocol !== PROTOCOL) {
      throw serviceError(`${target.where} speaks protocol ${answer?.protocol}, this client ${PROTOCOL}`);
    }
    return { connection, hello: answer };
  } catch (e) {
    connection.close();
    throw e;
  }
}

/**
 * A checked connection to the service `settings` name: `{target,
 * connection, hello}`, trying again (the pause doubling from RETRY_FIRST_MS
 * to RETRY_MAX_MS) until `deadline` (a `Date.now()` value); then the last
 * try's error. service.json is read anew at each try.
 *
 * `lost` (`{pid, secret, how}`) is the service whose connection was lost.
 * While service.json still names it, it is not taken back: it is stopping
 * (`how: 'shutdown'`), or was killed and left the file behind, and its
 * socket refuses. Only when it still runs and proves itself after
 * closing the connection (`how: 'closed'`), and goes on running for
 * STILL_RUNS_MS, is the end final (FINAL): it closed the connection
 * itself, and no restart is coming.
 */
async function reach(settings, deadline, { lost = null, signal } = {}) {
  const isLost = (target) => lost && target.pid === lost.pid && target.secret === lost.secret;
  let pause = RETRY_FIRST_MS;
  for (;;) {
    let reached;
    try {
      const target = await targetOf(settings);
      if (isLost(target)) {
        if (lost.how === 'shutdown') throw serviceError(`${target.where} is shutting down`);
        const { connection } = await dial(target);
        await sleep(STILL_RUNS_MS, undefined, { signal }).catch(() => {});
        const runs = !connection.closed && isLost(await targetOf(settings).catch(() => ({})));
        connection.close();
        if (!runs) throw serviceError(`${target.where} is shutting down`);
        const error = serviceError(`the connection to ${target.where} was closed by the service, which still runs`);
        error[FINAL] = true;
        throw error;
      }
      reached = { target, ...(await dial(target)) };
    } catch (e) {
      if (e[FINAL] || !(e instanceof ResourceError)) throw e;
      const left = deadline - Date.now();
      if (left <= 0 || signal?.aborted) throw e;
      try {
        await sleep(Math.min(pause, left), undefined, { signal });
      } catch {
        throw e; // aborted: the caller closed
      }
      pause = Math.min(2 * pause, RETRY_MAX_MS);
      continue;
    }
    if (signal?.aborted) {
      reached.connection.close();
      throw serviceError(`the connection to ${reached.target.where} was closed by the client`);
    }
    return reached;
  }
}

/**
 * Connects to the service of a store (`{store}`: found through its
 * service.json) or to a socket (`{socket}`), and checks that it speaks
 * protocol 1. Rejects with code `E_RESOURCE_SERVICE` when no service
 * listens there (after `wait` ms, when given), or when the one there is not
 * the user's own.
 *
 * Before connecting (except on Windows), the socket and its folder must be
 * the user's own and the folder closed to others. Through `{store}`, the
 * service must then answer `hello` with the proof that it holds the secret
 * of the store's service.json, and be the process the file names; nothing
 * else is sent before. `{socket}` proves nothing beyond the owner checks:
 * there is no secret to check.
 *
 * Options: `wait` (ms, default 0): how long to wait for a service to
 * appear; `reconnect` (ms, default RECONNECT_MS; 0 or false: never): how
 * long a client of a store looks for a new service after losing its own;
 * `answerTimeoutMs`; `appName`, the app that runs the service, named in the
 * messages.
 */
export async function connect(options = {}) {
  const settings = settingsOf(options);
  let reached;
  try {
    reached = await reach(settings, Date.now() + settings.wait);
  } catch (e) {
    if (settings.wait > 0 && e instanceof ResourceError) e.message += ` (waited ${seconds(settings.wait)} s)`;
    throw e;
  }
  return new Client(settings, reached);
}

/**
 * A connected socket to `target`, or an E_RESOURCE_SERVICE error naming
 * it. The socket and its folder are checked first; a service.json without
 * a secret is refused before connecting. Nothing is sent.
 */
async function open(target) {
  const { socket: socketPath, where, fromServiceFile } = target;
  await checkPlace(target);
  if (fromServiceFile && (typeof target.secret !== 'string' || target.secret === '')) {
    throw serviceError(
      `refusing to connect to ${where}: its service.json holds no secret (a service of an earlier version), ` +
        `so it cannot prove that it is the store's service: restart ${target.settings.appName ?? 'the service'}`,
    );
  }
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(socketPath);
    const onError = (e) => {
      socket.destroy();
      reject(serviceError(`cannot connect to ${where}: ${e.code ?? e.message}${stale(e, target)}`, e));
    };
    socket.once('error', onError);
    socket.once('connect', () => {
      socket.off('error', onError);
      resolve(socket);
    });
  });
}

/** What a failed connection says about a service.json that names no living service. */
function stale(e, { fromServiceFile, settings }) {
  if (!fromServiceFile || (e.code !== 'ECONNREFUSED' && e.code !== 'ENOENT')) return '';
  const start = settings.appName === undefined ? '' : `: start ${settings.appName}`;
  return `: its service.json is stale (the service stopped without removing it); ${settings.name} is not running${start}`;
}

/**
 * Refuses (E_RESOURCE_SERVICE) a socket that is not a socket, or not the
 * user's, or whose folder is not the user's own folder closed to others:
 * someone else could be listening there, or could put a socket of theirs
 * in its place. Not on Windows, whose named pipes have no such file.
 */
async function checkPlace(target) {
  const { socket: socketPath, where } = target;
  if (process.platform === 'win32') return;
  const me = typeof process.geteuid === 'function' ? process.geteuid() : process.getuid();
  const refuse = (why) => serviceError(`cannot connect to ${where}: ${why}: refusing to connect; nothing was sent`);
  let socket;
  try {
    socket = await fs.lstat(socketPath);
  } catch (e) {
    throw serviceError(`cannot connect to ${where}: ${e.code ?? e.message}${stale(e, target)}`, e);
  }
  if (!socket.isSocket()) {
    throw refuse(`${socketPath} is not a socket (${fileKind(socket)})`);
  }
  if (socket.uid !== me) {
    throw refuse(`the socket ${socketPath} belongs to user ${socket.uid}, not to this user (${me})`);
  }
  const folderPath = path.dirname(socketPath);
  let folder;
  try {
    folder = await fs.lstat(folderPath);
  } catch (e) {
    throw serviceError(`cannot connect to ${where}: cannot read its folder ${folderPath}: ${e.code ?? e.message}`, e);
  }
  if (!folder.isDirectory()) {
    throw refuse(`the socket's folder ${folderPath} is not a folder (${fileKind(folder)})`);
  }
  if (folder.uid !== me) {
    throw refuse(`the socket's folder ${folderPath} belongs to user ${folder.uid}, not to this user (${me})`);
  }
  if ((folder.mode & 0o077) !== 0) {
    const mode = (folder.mode & 0o777).toString(8).padStart(4, '0');
    throw refuse(`the socket's folder ${folderPath} is open to other users (mode ${mode}; it must be 0700)`);
  }
}

function fileKind(stats) {
  if (stats.isSymbolicLink()) return 'a symbolic link';
  if (stats.isDirectory()) return 'a folder';
  if (stats.isFile()) return 'a regular file';
  if (stats.isFIFO()) return 'a named pipe';
  return 'not a socket';
}

/**
 * Sends `hello` with a fresh random nonce on `connection` (its first
 * message) and checks the answer: the proof that the service holds the
 * secret of service.json, then the process and the protocol. The answer
 * to `hello`, or an E_RESOURCE_SERVICE error (the caller closes the
 * connection).
 */
async function proveService(connection, target) {
  const { where } = target;
  const nonce = crypto.randomBytes(32).toString('hex');
  let hello;
  try {
    hello = await helloWithin(connection, { nonce }, where);
  } catch (e) {
    if (e instanceof ResourceError && e.rpcCode === undefined) throw e; // the connection itself
    throw serviceError(
      `${where} answered hello with an error (${e.message}), so it did not prove that it holds the store's secret ` +
        '(service.json): not the store\'s service; nothing else was sent',
      e,
    );
  }
  if (!proves(target.secret, nonce, hello?.proof)) {
    throw serviceError(
      `${where} did not prove that it holds the store's secret (service.json): not the store's service; nothing else was sent`,
    );
  }
  if (hello.pid !== target.pid) {
    throw serviceError(
      `${where} is process ${hello.pid}, not the service ${target.pid} that service.json names: ` +
        'not the store\'s service; nothing else was sent',
    );
  }
  if (hello.protocol !== PROTOCOL) {
    throw serviceError(`${where} speaks protocol ${hello.protocol}, this client ${PROTOCOL}`);
  }
  return hello;
}

/**
 * Whether `proof` is hex(HMAC-SHA256(key: the text of `secret`, message:
 * HELLO_CONTEXT + nonce)), compared in constant time.
 */
function proves(secret, nonce, proof) {
  if (typeof secret !== 'string' || secret === '') return false;
  if (typeof proof !== 'string' || !/^[0-9a-fA-F]{64}$/.test(proof)) return false;
  const expected = crypto.createHmac('sha256', Buffer.from(secret, 'utf8')).update(HELLO_CONTEXT + nonce, 'utf8').digest();
  const given = Buffer.from(proof, 'hex');
  return given.length === expected.length && crypto.timingSafeEqual(given, expected);
}

/**
 * One line-delimited JSON-RPC connection: requests, answers matched by id,
 * notifications handed to `onNotification`.
 */
class Connection {
  constructor(socket, where, onNotification, answerTimeoutMs = ANSWER_TIMEOUT_MS) {
    this.socket = socket;
    this.where = where;
    this.answerTimeoutMs = answerTimeoutMs;
    this.onNotification = onNotification;
    this.nextId = 0;
    this.pending = new Map();
    this.closed = false;
    this.closeError = null;
    /** How the connection ended, when the service went away: 'closed' (the socket closed or failed), 'shutdown' (the service said it stops). */
    this.lost = undefined;
    /** The pieces of a line not ended yet, and their length. */
    this.partial = [];
    this.partialLength = 0;
    this.onClose = [];
    socket.setEncoding('utf8');
    socket.on('data', (chunk) => this.receive(chunk));
    socket.on('error', (e) => {
      const closed = e.code === 'EPIPE' || e.code === 'ECONNRESET';
      this.fail(serviceError(`the connection to ${where} ${closed ? 'closed' : 'failed'} (${e.code ?? e.message})`, e), 'closed');
    });
    socket.on('close', () => this.fail(serviceError(`the connection to ${where} closed`), 'closed'));
  }

  receive(chunk) {
    let start = 0;
    for (;;) {
      const end = chunk.indexOf('\n', start);
      if (end < 0) break;
      if (this.tooLong(end - start)) return;
      let line = chunk.slice(start, end);
      if (this.partial.length > 0) {
        line = this.partial.join('') + line;
        this.partial = [];
        this.partialLength = 0;
      }
      start = end + 1;
      if (line.trim() !== '') this.message(line);
      if (this.closed) return;
    }
    if (start < chunk.length) {
      if (this.tooLong(chunk.length - start)) return;
      this.partial.push(chunk.slice(start));
      this.partialLength += chunk.length - start;
    }
  }

  /** Fails the connection when `more` characters would make the line longer than MAX_LINE_FROM_SERVICE. */
  tooLong(more) {
    if (this.partialLength + more <= MAX_LINE_FROM_SERVICE) return false;
    this.partial = [];
    this.partialLength = 0;
    this.fail(serviceError(`${this.where} sent a line longer than ${MAX_LINE_FROM_SERVICE} bytes`));
    this.socket.destroy();
    return true;
  }

  message(line) {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      this.fail(serviceError(`${this.where} sent a line that is not JSON: ${line.slice(0, 200)}`));
      this.socket.destroy();
      return;
    }
    if (msg === null || typeof msg !== 'object') return;
    if (typeof msg.method === 'string' && msg.id === undefined) {
      this.onNotification(msg.method, msg.params);
      return;
    }
    const waiter = this.pending.get(msg.id);
    if (!waiter) return; // an answer to no request of ours (an error about an unreadable line has id null)
    if (msg.error !== undefined) {
      const error = ResourceError.fromRpc(msg.error);
      if (!waiter.closed && (error.code === 'E_RESOURCE_SHUTDOWN' || error.rpcCode === -32800)) {
        // The service is going away: once shut down it answers every call
        // E_RESOURCE_SHUTDOWN, and a connection it closes has its calls
        // cancelled (-32800, a call this client did not cancel). The call
        // is lost with the connection, like the others in flight.
        this.fail(serviceError(`${this.where} is shutting down`, error), 'shutdown');
        return;
      }
      this.pending.delete(msg.id);
      waiter.reject(error);
    } else {
      this.pending.delete(msg.id);
      waiter.resolve(msg.result);
    }
  }

  /**
   * Sends one request; a promise of its result. Options: `signal`, an
   * AbortSignal that rejects the call at once (E_RESOURCE_CANCELLED) and,
   * for a method the service can cancel, sends it `$/cancelRequest`;
   * `onSettled`, called synchronously when the call settles, however it
   * does (before the promise's reactions).
   */
  request(method, params, { signal, onSettled } = {}) {
    if (signal?.aborted) {
      const [error, settle] = abortError(method, signal.reason, false);
      settle('unknown');
      onSettled?.();
      return Promise.reject(error);
    }
    if (this.closed) {
      onSettled?.();
      return Promise.reject(this.closeError);
    }
    const id = ++this.nextId;
    const message = { jsonrpc: '2.0', id, method };
    if (params !== undefined) message.params = params;
    return new Promise((resolve, reject) => {
      let onAbort;
      let timer;
      const done = () => {
        if (onAbort) signal.removeEventListener('abort', onAbort);
        if (timer) clearTimeout(timer);
        onSettled?.();
      };
      const waiter = {
        method,
        resolve: (value) => {
          done();
          resolve(value);
        },
        reject: (error) => {
          done();
          reject(error);
        },
      };
      if (signal) {
        onAbort = () => this.abort(id, waiter, signal.reason);
        signal.addEventListener('abort', onAbort, { once: true });
      }
      this.pending.set(id, waiter);
      if (!WAITS_FOR_TRANSFER.has(method)) {
        timer = setTimeout(() => {
          if (this.pending.get(id) !== waiter) return;
          this.pending.delete(id);
          waiter.reject(
            serviceError(`${this.where} did not answer \`${method}\` within ${this.answerTimeoutMs / 1000} s`),
          );
        }, this.answerTimeoutMs);
        timer.unref?.();
      }
      this.socket.write(JSON.stringify(message) + '\n');
    });
  }

  /**
   * Rejects call `id` (still `waiter`) at once, its signal aborted. A call
   * the service can cancel is cancelled there with `$/cancelRequest`, and
   * its answer, when it comes within CANCEL_ANSWER_MS, tells the error's
   * `download`; another is only no longer waited for.
   */
  abort(id, waiter, reason) {
    if (this.pending.get(id) !== waiter) return;
    const [error, settle] = abortError(waiter.method, reason, true);
    if (!CANCELLABLE.has(waiter.method) || this.closed) {
      this.pending.delete(id);
      settle('unknown');
      waiter.reject(error);
      return;
    }
    const timer = setTimeout(() => {
      if (this.pending.get(id) === late) this.pending.delete(id);
      settle('unknown');
    }, CANCEL_ANSWER_MS);
    timer.unref?.();
    // What the service answers the cancelled call with, when it comes.
    const late = {
      method: waiter.method,
      resolve: () => {
        clearTimeout(timer);
        settle('unknown'); // it had finished before the cancel arrived
      },
      reject: (answer) => {
        clearTimeout(timer);
        if (answer.download === 'continues' || answer.download === 'stopped') settle(answer.download);
        else if (answer.rpcCode === -32800) settle('stopped'); // its own transfer ended with it
        else settle('unknown');
      },
      closed: () => {
        clearTimeout(timer);
        settle('unknown');
      },
    };
    this.pending.set(id, late);
    this.socket.write(JSON.stringify({ jsonrpc: '2.0', method: '$/cancelRequest', params: { id } }) + '\n');
    waiter.reject(error);
  }

  /**
   * Ends the connection: every pending request is rejected with `error`.
   * `lost` ('closed', 'shutdown') when the service went away, rather than
   * the client closing the connection or the service breaking the protocol;
   * those rejections are marked LOST.
   */
  fail(error, lost) {
    if (this.closed) return;
    this.closed = true;
    this.closeError = error;
    this.lost = lost;
    if (lost) error[LOST] = true;
    for (const [, waiter] of this.pending) {
      if (waiter.closed) {
        waiter.closed();
        continue;
      }
      const e = serviceError(
        `${error.message} before it answered \`${waiter.method}\``,
        error.cause,
      );
      if (lost) e[LOST] = true;
      waiter.reject(e);
    }
    this.pending.clear();
    this.socket.destroy();
    for (const f of this.onClose) f(error);
  }

  close() {
    this.fail(serviceError(`the connection to ${this.where} was closed by the client`));
  }
}

/**
 * The identity of the service `target` names, and how its connection was
 * lost: what `reach` must not take back.
 */
function lostService(target, how) {
  return { pid: target.pid, secret: target.secret, how };
}

/**
 * The error of calls that waited in vain for the service to come back, or
 * of a subscription that ends so (`what` says which).
 */
function goneError(what, settings, lost, last) {
  return serviceError(
    `${what}: ${settings.name} went away (${lost.message}) and none came back within ${seconds(settings.reconnect)} s ` +
      `(last try: ${last.message})`,
    last,
  );
}

/**
 * The error of a call that the service did not answer before it went away
 * (code E_RESOURCE_SERVICE, whatever the moment). It is not sent again:
 * the service may stop for good, and then no caller should wait; the caller
 * calls again, and the client then waits for the next service. `cause` is
 * the service's own error when it said why (E_RESOURCE_SHUTDOWN, or the
 * call cancelled with its connection), else the connection's.
 */
function cutOffError(settings, method, error) {
  const lost = error.message.replace(/ before it answered `[^`]*`$/, '');
  const then = SAFE_AGAIN.has(method)
    ? 'try again once it is back'
    : 'whether it was done is not known: check once it is back, and try again if need be';
  return serviceError(
    `${settings.name} went away before it answered \`${method}\` (${lost}); ${then}`,
    error.cause instanceof ResourceError ? error.cause : error,
  );
}

/**
 * Rejects with an E_RESOURCE_CANCELLED error (as a call's AbortSignal does)
 * when `signal` aborts before `promise` settles; else settles as it does.
 */
function unlessAborted(promise, signal, method, sent) {
  if (!signal) return promise;
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      const [error, settle] = abortError(method, signal.reason, sent);
      settle('unknown');
      reject(error);
    };
    if (signal.aborted) return onAbort();
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/**
 * A connection to the service. Every method returns a promise of the
 * method's result, exactly as PROTOCOL.md gives it, or rejects with a
 * `ResourceError`.
 *
 * A client of a store (`connect({store})`) outlives its service: when the
 * connection is lost it emits 'disconnected' (the error), looks for the
 * next service for `reconnect` ms, checks it as `connect` does, and emits
 * 'reconnected' (`{service, previous}`: the answers to `hello`). Calls made
 * meanwhile wait for it; calls in flight when the service went away reject
 * with E_RESOURCE_SERVICE. When no service came back in time, the calls
 * waiting reject (E_RESOURCE_SERVICE), and each later call tries once more.
 * A service that still runs and closed the connection itself, or broke the
 * protocol, ends the client; so does `close()`.
 */
export class Client extends EventEmitter {
  #settings;
  #target;
  /** The search for a new service under way: a promise of the connection. */
  #reconnecting = null;
  /** Why the client ended for good (closed, or the service broke the protocol or closed it itself). */
  #final = null;
  /** The error the connection was lost with, while no service took over. */
  #lost = null;
  #stop = new AbortController();

  constructor(settings, { target, connection, hello }) {
    super();
    this.answerTimeoutMs = settings.answerTimeoutMs;
    this.subscriptions = new Set();
    /** The `onProgress` of each call in flight, by its progress token. */
    this.progress = new Map();
    this.nextToken = 0;
    this.#settings = settings;
    this.#use(target, connection, hello);
  }

  /** Makes `connection` (to `target`, which answered `hello`) the client's. */
  #use(target, connection, hello) {
    this.#target = target;
    /** The socket (or named pipe) it is connected to. */
    this.socketPath = target.socket;
    this.where = target.where;
    /** The answer to `hello` that `connect` checked (with its `proof` through a store); the new service's after a restart. */
    this.service = hello;
    this.connection = connection;
    this.#lost = null;
    connection.onNotification = (method, params) => {
      if (method === '$/progress') this.progress.get(params?.token)?.(params.value);
    };
    connection.onClose.push((error) => this.#closed(connection, error));
    if (connection.closed) this.#closed(connection, connection.closeError); // gone already
  }

  /** Whether the client looks for the next service when it loses its own. */
  #reconnects() {
    return this.#settings.reconnect > 0 && this.#target.fromServiceFile;
  }

  #closed(connection, error) {
    if (connection !== this.connection || this.#final) return;
    if (!connection.lost || !this.#reconnects()) {
      this.#final = error;
      return;
    }
    this.#lost = error;
    process.nextTick(() => this.emit('disconnected', error));
    this.#reconnect(this.#settings.reconnect, lostService(this.#target, connection.lost));
  }

  /** Looks for a service for `within` ms; a promise of its connection. */
  #reconnect(within, lost) {
    const lostError = this.#lost;
    const attempt = reach(this.#settings, Date.now() + within, { lost, signal: this.#stop.signal }).then(
      ({ target, connection, hello }) => {
        this.#reconnecting = null;
        if (this.#final) {
          connection.close();
          throw this.#final;
        }
        const previous = this.service;
        this.#use(target, connection, hello);
        process.nextTick(() => this.emit('reconnected', { service: hello, previous }));
        return connection;
      },
      (e) => {
        this.#reconnecting = null;
        if (e[FINAL]) this.#final ??= e;
        if (this.#final) throw this.#final;
        throw within > 0 ? goneError('no answer', this.#settings, lostError, e) : e;
      },
    );
    attempt.catch(() => {});
    this.#reconnecting = attempt;
    return attempt;
  }

  /** The connection to send on: the current one, the one being looked for, or (after a search in vain) one more try. */
  #ready() {
    if (this.#final) return Promise.reject(this.#final);
    if (!this.connection.closed) return Promise.resolve(this.connection);
    return this.#reconnecting ?? this.#reconnect(0, null);
  }

  /**
   * Sends one request; its result, or a ResourceError. With `{signal}`,
   * aborting rejects at once with E_RESOURCE_CANCELLED and, for `path` and
   * `autofill`, cancels the call on the service (`$/cancelRequest`).
   * A call the service went away from rejects with E_RESOURCE_SERVICE; one
   * made while the client looks for the next service waits for it.
   */
  async request(method, params, { signal, onSettled } = {}) {
    try {
      for (;;) {
        const connection = await unlessAborted(this.#ready(), signal, method, false);
        try {
          return await connection.request(method, params, { signal });
        } catch (e) {
          // Lost before it was sent: it waits for the next service.
          if (e[LOST] && e === connection.closeError && !this.#final) continue;
          throw e[LOST] && this.#reconnects() ? cutOffError(this.#settings, method, e) : e;
        }
      }
    } finally {
      onSettled?.();
    }
  }

  /** `{protocol, version, store, pid}` (and `proof` when asked with a nonce). */
  hello() {
    return this.request('hello');
  }

  /** `{gems, undeclared_files, undeclared_bytes, service, store}`; one gem's only with `gem`. */
  status(gem) {
    return this.request('status', gem === undefined ? undefined : { gem });
  }

  /**
   * `{gem, resource, path}`, downloading the file first when it is missing.
   * `signal` cancels the call; `onProgress(event)` is called with each of
   * the call's own events (`queued`, `started`, `progress`, …, `verified`),
   * the last before the promise resolves. An exception thrown by
   * `onProgress` cancels the call, which rejects with it.
   */
  path(gem, id, { signal, onProgress } = {}) {
    if (onProgress === undefined) return this.request('path', { gem, id }, { signal });
    if (typeof onProgress !== 'function') throw new TypeError('path(): onProgress must be a function');
    const token = `p${++this.nextToken}`;
    // The call's own controller: the caller's signal, or onProgress throwing, aborts it.
    const controller = new AbortController();
    let thrown;
    const forward = () => controller.abort(signal.reason);
    if (signal?.aborted) forward();
    else signal?.addEventListener('abort', forward, { once: true });
    const onSettled = () => {
      this.progress.delete(token);
      signal?.removeEventListener('abort', forward);
    };
    this.progress.set(token, (event) => {
      try {
        onProgress(event);
      } catch (e) {
        thrown = { error: e };
        controller.abort(e);
      }
    });
    const call = this.request('path', { gem, id, progress: token }, { signal: controller.signal, onSettled });
    return call.catch((e) => {
      if (thrown) throw thrown.error;
      throw e;
    });
  }

  /**
   * The call's own events, then `{event: 'path', gem, resource, path}`, as
   * an async iterator: `for await (const e of client.pull(gem, id))`. The
   * call is sent at the first `next()`; leaving the loop early cancels it.
   */
  pull(gem, id, { signal } = {}) {
    return new Pull(this, gem, id, signal);
  }

  /**
   * The install report; required files then download in the background.
   * `signal` only stops waiting for the answer: the service does not cancel
   * an install.
   */
  install(gem, manifest, { signal } = {}) {
    return this.request('install', { gem, manifest }, { signal });
  }

  /** `{gem, installed, deleted, kept}`. */
  uninstall(gem) {
    return this.request('uninstall', { gem });
  }

  /** `{changed}`: the file goes ahead of background work. */
  downloadNow(gem, id) {
    return this.request('download_now', { gem, id });
  }

  /** `{changed}`. */
  cancel(gem, id) {
    return this.request('cancel', { gem, id });
  }

  /** `{changed}`. */
  retry(gem, id) {
    return this.request('retry', { gem, id });
  }

  /** `{size, sha256, served_by, final_url}` of a URL, by the download rules; nothing is kept. */
  autofill(url, { signal } = {}) {
    return this.request('autofill', { url }, { signal });
  }

  /**
   * `{ok, manifest, resources}`: the manifest with `size` and `sha256` filled.
   * Every address of each resource is read and reported in `addresses`
   * (`ok` is false when one failed or served other bytes); `urlOnly` reads
   * only until an address answers.
   */
  autofillManifest(manifest, { all, urlOnly, signal } = {}) {
    const params = { manifest };
    if (all !== undefined) params.all = Boolean(all);
    if (urlOnly !== undefined) params.url_only = Boolean(urlOnly);
    return this.request('autofill', params, { signal });
  }

  /** `{mode, hosts}`. */
  policy() {
    return this.request('policy');
  }

  /** `{stopped, queued}`; applies at once, to every client of the service. */
  setPolicy({ mode, hosts }) {
    return this.request('set_policy', { mode, hosts });
  }

  /**
   * Subscribes to the service's events (one gem's and `policy_changed`
   * with `{gem}`). Resolves to a `Subscription` once the service has
   * answered, with `status` as it stood then; iterate it for the events
   * that follow.
   */
  async subscribe({ gem } = {}) {
    await this.#ready();
    const target = this.#target;
    // Its own connection, checked as the client's was (a service that does
    // not prove itself gets nothing more, not even `unsubscribe`).
    const { connection } = await dial(target, { hello: false });
    const sub = new Subscription(connection, target, gem === undefined ? {} : { gem });
    this.subscriptions.add(sub);
    sub.onEnd = () => this.subscriptions.delete(sub);
    try {
      await sub.start();
    } catch (e) {
      sub.close();
      throw e;
    }
    return sub;
  }

  /** The service scoped to one gem: what a tool's `ctx.resources` is. */
  forGem(gem) {
    return new GemResources(this, gem);
  }

  /** Closes the connection and every subscription; pending requests reject, and so does every later call. */
  close() {
    this.#final ??= serviceError(`the connection to ${this.where} was closed by the client`);
    this.#stop.abort();
    for (const sub of [...this.subscriptions]) sub.close();
    this.connection.close();
  }
}

/** One gem's resources: `path(id)`, `pull(id)`, `status()`, `downloadNow(id)`, `cancel(id)`, `retry(id)`, `subscribe()`. */
export class GemResources {
  constructor(client, gem) {
    this.client = client;
    this.gem = gem;
  }

  /**
   * A promise of the file's local path, downloading it first when missing;
   * `signal` and `onProgress` as `Client.path`.
   */
  async path(id, options) {
    return (await this.client.path(this.gem, id, options)).path;
  }

  /** The call's own events, then `{event: 'path', gem, resource, path}`: see `Client.pull`. */
  pull(id, options) {
    return this.client.pull(this.gem, id, options);
  }

  /** The gem's `GemStatus`: `{gem, resources}`. */
  async status() {
    const status = await this.client.status(this.gem);
    const found = status.gems.find((g) => g.gem === this.gem);
    if (!found) {
      throw new ResourceError(`gem ${JSON.stringify(this.gem)} is not installed`, { code: 'E_RESOURCE_NOT_FOUND' });
    }
    return found;
  }

  downloadNow(id) {
    return this.client.downloadNow(this.gem, id);
  }

  cancel(id) {
    return this.client.cancel(this.gem, id);
  }

  retry(id) {
    return this.client.retry(this.gem, id);
  }

  /** The gem's events (and `policy_changed`). */
  subscribe() {
    return this.client.subscribe({ gem: this.gem });
  }
}

/**
 * One `path` call as an async iterator: its own events (`$/progress`),
 * then a last item `{event: 'path', gem, resource, path}`, then the end.
 * The call is sent at the first `next()`. When it fails, or its signal
 * aborts, the iteration throws that error once the events received before
 * are read. `return()` (leaving a `for await` loop early) cancels the call
 * on the service and resolves once the service answered (at most
 * CANCEL_ANSWER_MS).
 */
class Pull {
  constructor(client, gem, id, signal) {
    this.client = client;
    this.gem = gem;
    this.id = id;
    this.signal = signal;
    this.controller = new AbortController();
    this.call = null;
    this.queue = [];
    this.waiters = [];
    this.done = false;
    this.error = null;
  }

  start() {
    const { signal, controller } = this;
    const forward = () => controller.abort(signal.reason);
    if (signal?.aborted) forward();
    else signal?.addEventListener('abort', forward, { once: true });
    this.call = this.client.path(this.gem, this.id, { signal: controller.signal, onProgress: (event) => this.push(event) });
    this.call.then(
      (r) => {
        this.push({ event: 'path', gem: r.gem, resource: r.resource, path: r.path });
        this.finish(null);
      },
      (e) => this.finish(e),
    ).finally(() => signal?.removeEventListener('abort', forward));
  }

  push(item) {
    if (this.done) return;
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve({ value: item, done: false });
    else this.queue.push(item);
  }

  finish(error) {
    if (this.done) return;
    this.done = true;
    this.error = error;
    while (this.waiters.length > 0) {
      const waiter = this.waiters.shift();
      if (this.error) {
        waiter.reject(this.error);
        this.error = null;
      } else {
        waiter.resolve({ value: undefined, done: true });
      }
    }
  }

  next() {
    if (this.call === null) this.start();
    if (this.queue.length > 0) return Promise.resolve({ value: this.queue.shift(), done: false });
    return nextWhenEmpty(this);
  }

  async return() {
    const running = this.call !== null && !this.done;
    this.queue = [];
    this.finish(null);
    this.error = null;
    if (running) {
      this.controller.abort(new ResourceError('the iteration of `pull` ended before the path', { code: E_RESOURCE_CANCELLED }));
      await this.call.catch((e) => e.downloadOutcome);
    }
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

/**
 * What an iterator's `next()` gives once its queue is empty: its error
 * (thrown once; the iteration is then over), the end, or a wait for the
 * next item. `it` has `done`, `error` and `waiters`.
 */
function nextWhenEmpty(it) {
  if (it.done) {
    if (it.error) {
      const error = it.error;
      it.error = null;
      return Promise.reject(error);
    }
    return Promise.resolve({ value: undefined, done: true });
  }
  return new Promise((resolve, reject) => it.waiters.push({ resolve, reject }));
}

/**
 * The events of one subscription, as an async iterator:
 * `for await (const event of sub)`. `status` is the status the service
 * answered `subscribe` with; events follow it.
 *
 * The iteration ends after `close()`. It throws a `ResourceError` with
 * code `E_RESOURCE_LAGGED` (`missed`: how many events were lost) after the
 * service said the subscription fell behind, once the events received before
 * are read: subscribe again and redraw from the new `status`.
 *
 * When the service goes away, a subscription through a store subscribes
 * again on the next service (checked as every connection is), within the
 * client's `reconnect` ms: `status` is then the new service's, and the
 * iteration yields `{event: 'resubscribed', at, reason: 'service
 * restarted', status}` before the new service's events; redraw from it.
 * When no service comes back in time, or through a socket, the iteration
 * throws code `E_RESOURCE_SERVICE`.
 */
export class Subscription {
  #settings;
  #target;
  #params;
  #stop = new AbortController();
  /** The notifications of a new connection, held until its `subscribe` is answered; null otherwise. */
  #held = null;

  constructor(connection, target, params) {
    /** `[GemStatus…]` as of the subscription (of the new service, after a restart). */
    this.status = [];
    /** The service's number for it. */
    this.id = null;
    this.queue = [];
    this.waiters = [];
    this.done = false;
    this.error = null;
    this.paused = false;
    this.onEnd = () => {};
    this.#settings = target.settings;
    this.#params = params;
    this.#use(connection, target);
  }

  #use(connection, target) {
    this.#target = target;
    this.where = target.where;
    this.connection = connection;
    connection.onNotification = (method, params) => {
      if (this.#held) this.#held.push([method, params]);
      else this.notification(method, params);
    };
    connection.onClose.push((error) => this.#closed(connection, error));
  }

  async start() {
    const result = await this.connection.request('subscribe', this.#params);
    this.id = result.subscription;
    this.status = result.status;
  }

  #closed(connection, error) {
    if (this.done || connection !== this.connection || this.#held) return; // #resubscribe sees to its own
    if (!connection.lost || this.#settings.reconnect === 0 || !this.#target.fromServiceFile || this.id === null) {
      this.finish(error);
      return;
    }
    this.#resubscribe(error, lostService(this.#target, connection.lost));
  }

  /** Subscribes again on the next service, within `reconnect` ms; else ends with E_RESOURCE_SERVICE. */
  async #resubscribe(lostError, lost) {
    const deadline = Date.now() + this.#settings.reconnect;
    while (!this.done) {
      let reached;
      try {
        reached = await reach(this.#settings, deadline, { lost, signal: this.#stop.signal });
      } catch (e) {
        this.finish(e[FINAL] ? e : goneError('the subscription ended', this.#settings, lostError, e));
        return;
      }
      const { target, connection } = reached;
      if (this.done) {
        connection.close();
        return;
      }
      this.#held = [];
      this.#use(connection, target);
      let result;
      try {
        result = await connection.request('subscribe', this.#params);
      } catch (e) {
        connection.close(); // while held: not taken for a loss of its own
        this.#held = null;
        if (e[LOST] && Date.now() < deadline) {
          lost = lostService(target, connection.lost);
          continue; // that one went away too
        }
        this.finish(e[LOST] ? goneError('the subscription ended', this.#settings, lostError, e) : e);
        return;
      }
      const held = this.#held;
      this.#held = null;
      if (this.done) return;
      this.id = result.subscription;
      this.status = result.status;
      this.push({ event: 'resubscribed', at: new Date().toISOString(), reason: 'service restarted', status: result.status });
      for (const [method, params] of held) this.notification(method, params);
      if (this.paused) connection.socket.pause();
      if (connection.closed) this.#closed(connection, connection.closeError); // lost again meanwhile
      return;
    }
  }

  notification(method, params) {
    if (this.done) return;
    if (method === 'event') {
      this.push(params);
    } else if (method === 'lagged') {
      const missed = params?.missed;
      const error = new ResourceError(
        `the subscription fell behind and the service ended it (${missed ?? 'some'} event(s) missed): subscribe again and redraw from its status`,
        { code: E_RESOURCE_LAGGED, data: params },
      );
      error.missed = missed;
      error.subscription = params?.subscription;
      this.finish(error);
      this.connection.close();
    }
  }

  push(event) {
    const waiter = this.waiters.shift();
    if (waiter) {
      waiter.resolve({ value: event, done: false });
      return;
    }
    this.queue.push(event);
    if (!this.paused && this.queue.length >= SUBSCRIPTION_BUFFER) {
      // Not read: let the socket fill, so the service sees it and, past its
      // own queue, says `lagged`.
      this.paused = true;
      this.connection.socket.pause();
    }
  }

  /** Ends the iteration: with `error` (thrown once the queue is read), or normally. */
  finish(error) {
    if (this.done) return;
    this.done = true;
    this.error = error;
    this.onEnd();
    while (this.waiters.length > 0 && this.queue.length === 0) {
      const waiter = this.waiters.shift();
      if (this.error) waiter.reject(this.error);
      else waiter.resolve({ value: undefined, done: true });
    }
  }

  next() {
    if (this.queue.length > 0) {
      const value = this.queue.shift();
      if (this.paused && this.queue.length < SUBSCRIPTION_BUFFER / 2) {
        this.paused = false;
        if (!this.done) this.connection.socket.resume();
      }
      return Promise.resolve({ value, done: false });
    }
    return nextWhenEmpty(this);
  }

  return() {
    this.close();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /**
   * Ends the subscription: sends `unsubscribe`, then closes its connection.
   * The iteration ends once the events already received are read.
   */
  close() {
    if (this.done) return;
    this.finish(null);
    this.#stop.abort();
    const connection = this.connection;
    connection.socket.resume(); // to read the answer
    connection.request('unsubscribe', this.id === null ? {} : { subscription: this.id })
      .catch(() => {})
      .finally(() => connection.close());
    // Nothing more is read from a closed subscription: a service that does
    // not answer `unsubscribe` in time does not keep the socket open.
    setTimeout(() => connection.close(), 1000).unref();
  }
}
