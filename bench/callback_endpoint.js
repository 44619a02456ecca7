// A callback endpoint for bench/callbacks.py: answers every POST 204 at once and counts
// them; `GET /count` says how many. Node's HTTP server costs a small part of what a Python
// one does, so on a 2-core machine the endpoint takes less of the cores the drain needs.
// Usage: node bench/callback_endpoint.js PORT
"use strict";
const http = require("http");
let taken = 0;
http
  .createServer((request, response) => {
    if (request.method === "GET" && request.url === "/count") {
      response.writeHead(200, { "content-type": "text/plain" });
      response.end(String(taken));
      return;
    }
    request.resume();
    request.on("end", () => {
      taken += 1;
      response.writeHead(204);
      response.end();
    });
  })
  .listen(Number(process.argv[2]), "127.0.0.1", () => console.log("ready"));
