// Looking for the next service after the client lost its own, and the
// errors of calls cut off or left waiting when it went away.

import { setTimeout as sleep } from 'node:timers/promises';

import { dial, targetOf } from './dial.js';
import { FINAL, ResourceError, seconds, serviceError } from './errors.js';
import { E_RESOURCE_BUSY } from './service.js';

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
export const SAFE_AGAIN = new Set(['hello', 'status', 'path', 'policy', 'autofill']);

/**
 * The longest pause, in ms, of a client with `takeOver` that lost its
 * service before it looks again and, finding none, starts the next: each
 * client draws its own pause at random, so that of the instances that lost
 * the service, one starts the next and the others find it (the store's
 * lock decides a race: the others are told E_RESOURCE_BUSY, and connect).
 */
export const TAKE_OVER_JITTER_MS = 150;

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
 *
 * With `settings.takeOver` (a function that starts a service on the
 * store), a try that reaches no service starts one, after a random pause
 * of up to TAKE_OVER_JITTER_MS when a service was lost; E_RESOURCE_BUSY
 * (another service holds the store: another client started it, or the
 * one lost still stops) means looking again; another error of the start
 * ends the search with it.
 */
export async function reach(settings, deadline, { lost = null, signal } = {}) {
  const isLost = (target) => lost && target.pid === lost.pid && target.secret === lost.secret;
  let pause = RETRY_FIRST_MS;
  let jitter = lost !== null && settings.takeOver !== undefined;
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
      if (settings.takeOver !== undefined && !signal?.aborted) {
        if (jitter) {
          jitter = false;
          await sleep(Math.random() * TAKE_OVER_JITTER_MS, undefined, { signal }).catch(() => {});
          continue; // another client may have started it meanwhile
        }
        try {
          await settings.takeOver();
          pause = RETRY_FIRST_MS;
          continue; // it listens: reach it
        } catch (start) {
          if (start?.code !== E_RESOURCE_BUSY) throw start;
          // Another service holds the store: reach it once it listens.
        }
      }
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
 * The identity of the service `target` names, and how its connection was
 * lost: what `reach` must not take back.
 */
export function lostService(target, how) {
  return { pid: target.pid, secret: target.secret, how };
}

/**
 * The error of calls that waited in vain for the service to come back, or
 * of a subscription that ends so (`what` says which).
 */
export function goneError(what, settings, lost, last) {
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
export function cutOffError(settings, method, error) {
  const lost = error.message.replace(/ before it answered `[^`]*`$/, '');
  const then = SAFE_AGAIN.has(method)
    ? 'try again once it is back'
    : 'whether it was done is not known: check once it is back, and try again if need be';
  return serviceError(
    `${settings.name} went away before it answered \`${method}\` (${lost}); ${then}`,
    error.cause instanceof ResourceError ? error.cause : error,
  );
}
