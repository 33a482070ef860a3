// One line-delimited JSON-RPC 2.0 connection to a service: framing,
// requests matched to answers by id, cancellation, timeouts.

import { E_RESOURCE_CANCELLED, LOST, ResourceError, abortError, serviceError } from './errors.js';

/** The methods whose call the service cancels on `$/cancelRequest`. */
const CANCELLABLE = new Set(['path', 'autofill']);

/** How long an aborted call waits for the service's answer to its
 * `$/cancelRequest` (ms), for `error.downloadOutcome`. */
export const CANCEL_ANSWER_MS = 5000;

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

/** `connection.request('hello', params)`, failed (E_RESOURCE_SERVICE) and
 * the connection closed when no answer comes within HELLO_TIMEOUT_MS. */
export function helloWithin(connection, params, where) {
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

/**
 * One line-delimited JSON-RPC connection: requests, answers matched by id,
 * notifications handed to `onNotification`.
 */
export class Connection {
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
