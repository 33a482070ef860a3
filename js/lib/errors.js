// The errors of the client and the few helpers their messages share.

/** The protocol this client speaks. */
export const PROTOCOL = 1;

/** The connection to the service failed or closed (a client-side code). */
export const E_RESOURCE_SERVICE = 'E_RESOURCE_SERVICE';
/** A subscription fell behind and was ended by the service. */
export const E_RESOURCE_LAGGED = 'E_RESOURCE_LAGGED';
/** A call was cancelled: by its AbortSignal, or by `$/cancelRequest`. */
export const E_RESOURCE_CANCELLED = 'E_RESOURCE_CANCELLED';

/** Marks an error of a connection lost with the service (not closed by the client, nor broken by the service). */
export const LOST = Symbol('lost');
/** Marks the end of a client or subscription that reconnecting cannot mend. */
export const FINAL = Symbol('final');

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
export function abortError(method, reason, sent) {
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

export function serviceError(message, cause) {
  const error = new ResourceError(message, { code: E_RESOURCE_SERVICE });
  if (cause !== undefined) error.cause = cause;
  return error;
}

/** `text` with its first letter in capitals. */
export function capitalized(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** Milliseconds as seconds, for messages: `1.5`, `30`. */
export function seconds(ms) {
  return String(Math.round(ms / 100) / 10);
}

/**
 * Rejects with an E_RESOURCE_CANCELLED error (as a call's AbortSignal does)
 * when `signal` aborts before `promise` settles; else settles as it does.
 */
export function unlessAborted(promise, signal, method, sent) {
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
