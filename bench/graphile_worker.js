// graphile-worker with nodemailer, for bench/dbcost.py's side-by-side figures: the same
// email, the same relay, graphile-worker's own defaults. Not part of outboxd.
//
//   node graphile_worker.js migrate <database url>
//   node graphile_worker.js work <database url> <smtp port>
//
// `work` prints "ready" once it runs, then each recipient and the time it was sent (Unix
// seconds) as it is sent, and runs until SIGTERM. graphile-worker and nodemailer come from
// bench/node_modules: `npm ci --prefix bench` (bench/package.json).

const { run, runMigrations } = require("graphile-worker");
const net = require("net");
const nodemailer = require("nodemailer");

// nodemailer leaves Nagle's algorithm on: against smtp-sink each message then waits 40 ms
// for a delayed ACK (45 ms a message against 2.4 here). Turning it off changes nothing in
// the database and keeps graphile-worker's drain from taking a quarter of an hour.
function connectWithoutDelay(options, callback) {
  const socket = net.connect({ host: options.host, port: options.port, noDelay: true });
  socket.once("connect", () => callback(null, { connection: socket }));
  socket.once("error", callback);
}

async function main() {
  const [mode, connectionString, smtpPort] = process.argv.slice(2);
  if (mode === "migrate") {
    await runMigrations({ connectionString });
    return;
  }
  if (mode !== "work") {
    throw new Error(`unknown mode ${mode}`);
  }
  const transport = nodemailer.createTransport({
    host: "127.0.0.1",
    port: Number(smtpPort),
    secure: false,
    ignoreTLS: true,
    pool: true,
    getSocket: connectWithoutDelay,
  });
  const runner = await run({
    connectionString,
    noHandleSignals: true,
    taskList: {
      account_verification: async (payload) => {
        await transport.sendMail({
          from: "Bench <bench@example.com>",
          to: payload.to,
          subject: "Verify your email address",
          text: `Hello ${payload.name},\n\nPlease verify: ${payload.verify_url}\n`,
        });
        console.log(payload.to, Date.now() / 1000);
      },
    },
  });
  console.log("ready");
  process.on("SIGTERM", () => {
    runner.stop().then(() => {
      transport.close();
      process.exit(0);
    });
  });
  await runner.promise;
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
