// `connect` and the client: the calls of protocol 1, and the client's
// own connection, which outlives its service.

import { EventEmitter } from 'node:events';

import { ANSWER_TIMEOUT_MS } from './connection.js';
import { dial } from './dial.js';
import { E_RESOURCE_CANCELLED, FINAL, LOST, ResourceError, seconds, serviceError, unlessAborted } from './errors.js';
import { RECONNECT_MS, SAFE_AGAIN, cutOffError, goneError, lostService, reach } from './reconnect.js';
import { startService } from './service.js';
import { Subscription, nextWhenEmpty } from './subscription.js';

/**
 * How long `connect` with `takeOver` waits for a service by default (ms):
 * time for the one it starts, or another client's, to listen.
 */
const TAKE_OVER_WAIT_MS = 10_000;

/**
 * `connect`'s `takeOver` as a function that starts a service on `store`
 * (one start at a time: the client and its subscriptions share it), and
 * `started`, where it keeps what `startService` resolved with; undefined
 * without `takeOver`.
 */
function takeOverOf(takeOver, store, started) {
  if (takeOver === undefined || takeOver === false || takeOver === null) return undefined;
  if (store === undefined) throw new TypeError('connect(): takeOver needs {store}');
  let start;
  if (typeof takeOver === 'function') {
    start = () => takeOver({ store });
  } else if (takeOver === true || typeof takeOver === 'object') {
    const options = takeOver === true ? {} : takeOver;
    start = async () => {
      const service = await startService({ ...options, store });
      started.push(service);
      return service;
    };
  } else {
    throw new TypeError('connect(): takeOver must be true, the options of startService, or a function');
  }
  let running = null;
  return () => {
    running ??= Promise.resolve()
      .then(start)
      .finally(() => {
        running = null;
      });
    return running;
  };
}

/**
 * What `connect` was given, checked: `{store}` or `{socket}`,
 * `answerTimeoutMs`, `wait` and `reconnect` (ms), `takeOver` (a function
 * starting a service) and `resend`, and `name`, how messages name the
 * service ("Notes's resource service" with `appName: 'Notes'`).
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
  const started = [];
  const takeOver = takeOverOf(options.takeOver, typeof socket === 'string' ? undefined : store, started);
  if (options.resend !== undefined && typeof options.resend !== 'boolean') {
    throw new TypeError('connect(): resend must be a boolean');
  }
  return {
    store: typeof socket === 'string' ? undefined : store,
    socket: typeof socket === 'string' ? socket : undefined,
    answerTimeoutMs: ms('answerTimeoutMs', options.answerTimeoutMs ?? ANSWER_TIMEOUT_MS, true),
    wait: ms('wait', options.wait ?? (takeOver === undefined ? 0 : TAKE_OVER_WAIT_MS), false),
    takeOver,
    started,
    resend: options.resend ?? takeOver !== undefined,
    reconnect: options.reconnect === false ? 0 : ms('reconnect', options.reconnect ?? RECONNECT_MS, false),
    appName,
    name: appName === undefined ? 'the resource service' : `${appName}'s resource service`,
  };
}

/**
 * Connects to the service of a store (`{store}`: found through its
 * service.json) or to a socket (`{socket}`), and checks that it speaks
 * protocol 1. Rejects with code `E_RESOURCE_SERVICE` when no service
 * listens there (after `wait` ms, when given; `no store at …` when the
 * store's folder is not there), or when the one there is not the user's
 * own.
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
 *
 * `takeOver` (through `{store}` only) makes the client one of the
 * instances that keep the store's service running: `true`, the options of
 * `startService` (`{bin, config, gems, args, env}`; the store is the
 * client's), or a function `({store}) => Promise` that starts one and
 * rejects with code E_RESOURCE_BUSY when another holds the store. When
 * no service listens, at `connect` or after the client lost its own (then
 * after a random pause of up to TAKE_OVER_JITTER_MS), the client starts
 * one; when another client won the race (E_RESOURCE_BUSY), it connects to
 * that one. `wait` is then 10 s unless given. `resend` (default: on with
 * `takeOver`): calls that change nothing, cut off by the service going
 * away, are sent again to the next service.
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
 * A connection to the service. Every method returns a promise of the
 * method's result, exactly as PROTOCOL.md gives it, or rejects with a
 * `ResourceError`.
 *
 * A client of a store (`connect({store})`) outlives its service: when the
 * connection is lost it emits 'disconnected' (the error), looks for the
 * next service for `reconnect` ms, checks it as `connect` does, and emits
 * 'reconnected' (`{service, previous}`: the answers to `hello`). Calls made
 * meanwhile wait for it; calls in flight when the service went away reject
 * with E_RESOURCE_SERVICE, or (`resend`) are sent again when they change
 * nothing. With `takeOver`, it starts the next service itself. When no service came back in time, the calls
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

  /**
   * What `startService` resolved with for each service this client started
   * (`takeOver` with options), oldest first: `{child, socket, pid, exited}`.
   * Each lives until this process ends, or until stopped
   * (`child.kill('SIGTERM')`).
   */
  get startedServices() {
    return [...this.#settings.started];
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
   * A call the service went away from rejects with E_RESOURCE_SERVICE,
   * unless it changes nothing (`path`, `status`, `policy`, `hello`,
   * `autofill`) and the client resends (`resend`, on with `takeOver`): it
   * is then sent again to the next service. One made while the client
   * looks for the next service waits for it.
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
          // Cut off, and it changes nothing: sent again to the next service.
          if (e[LOST] && this.#reconnects() && this.#settings.resend && SAFE_AGAIN.has(method) && !this.#final) continue;
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
    return this.withProgress('path', { gem, id }, { signal, onProgress });
  }

  /**
   * Sends `method` with `params`; with `onProgress`, under a fresh progress
   * token whose `$/progress` values it is called with. An exception thrown
   * by `onProgress` cancels the call, which rejects with it.
   */
  withProgress(method, params, { signal, onProgress } = {}) {
    if (onProgress === undefined) return this.request(method, params, { signal });
    if (typeof onProgress !== 'function') throw new TypeError(`${method}(): onProgress must be a function`);
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
    const call = this.request(method, { ...params, progress: token }, { signal: controller.signal, onSettled });
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

  /**
   * `{size, sha256, served_by, final_url}` of a URL, by the download rules;
   * nothing is kept. `onProgress({event: 'autofill_progress', resource,
   * address, bytes, size, done})` is called as it reads (at most every
   * 100 ms, plus each address's first and the last).
   */
  autofill(url, { signal, onProgress } = {}) {
    return this.withProgress('autofill', { url }, { signal, onProgress });
  }

  /**
   * `{ok, manifest, resources}`: the manifest with `size` and `sha256` filled.
   * Every address of each resource is read and reported in `addresses`
   * (`ok` is false when one failed or served other bytes); `urlOnly` reads
   * only until an address answers. `onProgress` as `autofill`'s, for each
   * resource (several are read at once; `done` ends each).
   */
  autofillManifest(manifest, { all, urlOnly, signal, onProgress } = {}) {
    const params = { manifest };
    if (all !== undefined) params.all = Boolean(all);
    if (urlOnly !== undefined) params.url_only = Boolean(urlOnly);
    return this.withProgress('autofill', params, { signal, onProgress });
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
    // Its own connection, checked as the client's was, `hello` first (a
    // service that does not prove itself gets nothing more, not even
    // `unsubscribe`).
    const { connection } = await dial(target);
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
