#!/usr/bin/env python3
"""Reproducer for a race berth's fast failover relies on (found while
measuring issue 17): when a process is killed, does a peer that sees one of
its connections reset find the process's listening port already closed?

A child opens a listener first (low fd), then FILLERS more files and
sockets, then a connection to us (highest fd); we SIGKILL it, wait for the
reset on that connection and connect to its listener at once. berth's
follower does exactly this (crates/cluster/src/transport/server.rs: a
refused connect means "the leader's process is gone, elect now").

An exiting process's files are released one by one; on this machine
(kernel 6.18) the connection is often released before the listener, so
the probe is *accepted*, more often the more files the process holds
(2 of 200 with none, 134 of 200 with 400, 97 of 100 with 4,000), and the
follower then waits out the election timeout.

    scripts/listener-close-race.py [TRIALS] [FILLERS]
"""
import os, socket, signal, sys, time
trials, fillers = int(sys.argv[1]) if len(sys.argv) > 1 else 100, int(sys.argv[2]) if len(sys.argv) > 2 else 200
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(16)
port = srv.getsockname()[1]
ok = refused = 0
for _ in range(trials):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(("127.0.0.1", 0)); ls.listen(16)
        junk = [open("/dev/null") for _ in range(fillers)]
        junk += [socket.socket() for _ in range(fillers)]
        c = socket.create_connection(("127.0.0.1", port))
        os.write(w, str(ls.getsockname()[1]).encode().ljust(8))
        time.sleep(100)
        os._exit(0)
    lport = int(os.read(r, 8)); os.close(r); os.close(w)
    conn, _ = srv.accept()
    os.kill(pid, signal.SIGKILL)
    try:
        conn.recv(1)
    except OSError:
        pass
    try:
        p = socket.create_connection(("127.0.0.1", lport), timeout=0.2); p.close(); ok += 1
    except ConnectionRefusedError:
        refused += 1
    conn.close(); os.waitpid(pid, 0)
print(f"fillers={fillers}: after the reset the dead process's listener accepted {ok} of {trials} probes, refused {refused}")
