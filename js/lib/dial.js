// Finding a store's service (service.json) and opening a checked
// connection to it: the socket's owner and folder, then `hello` with the
// proof that the service holds the store's secret.

import crypto from 'node:crypto';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';

import { Connection, helloWithin } from './connection.js';
import { PROTOCOL, ResourceError, capitalized, serviceError } from './errors.js';

/** What a service's `hello` proof is an HMAC of, followed by the nonce. */
const HELLO_CONTEXT = 'gem-resources hello\n';

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
 * The service `settings` name at this moment: `{socket, where,
 * fromServiceFile, secret, pid, settings}`, read anew from service.json
 * through a store; an E_RESOURCE_SERVICE error when the store has none.
 */
export async function targetOf(settings) {
  if (settings.socket !== undefined) {
    return { socket: settings.socket, where: `socket ${settings.socket}`, fromServiceFile: false, secret: null, pid: null, settings };
  }
  const { store } = settings;
  const info = await readServiceFile(store);
  if (info === null) {
    // A store folder that is not there is most often a mistyped path: said
    // as the command line says it (`no store at …`).
    if (!(await isFolder(storeLayout(store)))) {
      const start = settings.appName === undefined ? '' : `, or start ${settings.appName}, which makes it`;
      throw serviceError(
        `no store at ${store} (nothing was ever installed there and no service runs on it; ` +
          `check the store given to connect${start})`,
      );
    }
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

/** Whether `folder` is a folder (false when it is not there). */
async function isFolder(folder) {
  try {
    return (await fs.stat(folder)).isDirectory();
  } catch {
    return false;
  }
}

/**
 * A new connection to `target`, checked as every connection is (see
 * `open`, `proveService`): `{connection, hello}`. Every connection, a
 * subscription's too, sends `hello` first: the service answers nothing
 * else before it.
 */
export async function dial(target) {
  const socket = await open(target);
  const connection = new Connection(socket, target.where, () => {}, target.settings.answerTimeoutMs);
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
