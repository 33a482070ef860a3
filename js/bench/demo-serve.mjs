// A service to look at by hand: the test fixture's origin (one 40 MiB file
// at 256 KiB/s per response, held for 8 s of every 16 s with DEMO_STALL=1)
// and a real serve; prints the arguments to give the command line, and
// runs until Ctrl-C.
//
//   node js/bench/demo-serve.mjs
import { Fixture } from '../test/fixture.js';

const cleanups = [];
const ctx = await Fixture.start({ after: (fn) => cleanups.push(fn) });
const file = ctx.origin.add('big.bin', { size: 40 * 1024 * 1024 });
ctx.origin.behave('big.bin', { rate: 256 * 1024 });
const client = await ctx.connect();
await ctx.installGem('demo', [ctx.resource(file, { id: 'big' })], client);
console.log(`gem-resources ${ctx.baseArgs().join(' ')} path demo big`);
process.on('SIGINT', async () => {
  for (const fn of cleanups.reverse()) await fn();
  process.exit(0);
});
if (process.env.DEMO_STALL) {
  let held = false;
  setInterval(() => {
    held = !held;
    ctx.origin.behave('big.bin', { hold: held });
  }, 8000);
}
setInterval(() => {}, 1 << 30);
