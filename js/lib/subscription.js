// A subscription to the service's events, on a connection of its own,
// as an async iterator; it subscribes again on the next service.

import { E_RESOURCE_LAGGED, FINAL, LOST, ResourceError } from './errors.js';
import { goneError, lostService, reach } from './reconnect.js';

/** Events a subscription holds before it stops reading its socket; the
 * service then queues for it, and past its own limit sends `lagged`. */
const SUBSCRIPTION_BUFFER = 256;

/**
 * What an iterator's `next()` gives once its queue is empty: its error
 * (thrown once; the iteration is then over), the end, or a wait for the
 * next item. `it` has `done`, `error` and `waiters`.
 */
export function nextWhenEmpty(it) {
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
