// berth's web console, pages: one `page(pattern, render)` per screen. A
// render function builds the page in `main` and returns its refresh
// function, which the core calls now and every few seconds.
"use strict";

(() => {
  const { el, api, enc, page, serverTable, table, kv, tiles, chart, form, button, link, fmtNumber, fmtBytes, get, isAdmin, vhostNames } = Berth;

  function rate(o, key) {
    return get(o, `message_stats.${key}_details.rate`) || 0;
  }

  function queueLink(q) {
    return link(`/queues/${enc(q.vhost)}/${enc(q.name)}`, q.name);
  }

  function exchangeLink(e) {
    return link(`/exchanges/${enc(e.vhost)}/${enc(e.name || "amq.default")}`, e.name || "(AMQP default)");
  }

  // ---- overview ----------------------------------------------------------

  page("/", (main) => {
    const top = el("div", {});
    const rates = chart("Message rates (per second)", ["publish", "deliver_get", "ack"], "chart-rates");
    const depth = chart("Queued messages", ["ready", "unacked"], "chart-queued");
    const listeners = el("div", {});
    main.append(el("h1", {}, "Overview"), top, rates.node, depth.node, el("h2", {}, "Listeners"), listeners);
    return async () => {
      const o = await api("GET", "/overview");
      const t = o.object_totals || {};
      const q = o.queue_totals || {};
      top.replaceChildren(
        el("p", { class: "muted" }, `${o.product_name} ${o.product_version} on ${o.node}`),
        tiles([
          ["connections", t.connections], ["channels", t.channels], ["exchanges", t.exchanges],
          ["queues", t.queues, "total-queues"], ["consumers", t.consumers],
          ["messages", q.messages, "total-messages"], ["ready", q.messages_ready], ["unacked", q.messages_unacknowledged],
        ]),
      );
      rates.add({ publish: rate(o, "publish"), deliver_get: rate(o, "deliver_get"), ack: rate(o, "ack") });
      depth.add({ ready: q.messages_ready || 0, unacked: q.messages_unacknowledged || 0 });
      listeners.replaceChildren(table([
        { label: "Node", key: "node" }, { label: "Address", key: "ip_address" }, { label: "Port", key: "port", num: true },
      ], o.listeners || []));
    };
  });

  // ---- connections and channels ------------------------------------------

  page("/connections", (main) => {
    const t = serverTable("/connections", [
      { label: "Name", key: "name", render: (c) => link(`/connections/${enc(c.name)}`, c.name) },
      { label: "User", key: "user" },
      { label: "Vhost", key: "vhost" },
      { label: "Client", key: "client_properties.product", nosort: true },
      { label: "Channels", key: "channels", num: true },
      { label: "Heartbeat (s)", key: "timeout", num: true },
      { label: "", nosort: true, render: (c) => button("Close", () => closeConnection(c.name), { danger: true, ask: `Close connection ${c.name}?` }) },
    ], { id: "connections" });
    main.append(el("h1", {}, "Connections"), t.node);
    return t.refresh;
  });

  function closeConnection(name) {
    return api("DELETE", `/connections/${enc(name)}`);
  }

  page("/connections/:name", (main, p) => {
    const details = el("div", {});
    const channels = el("div", {});
    main.append(el("h1", {}, "Connection ", p.name), details,
      el("p", {}, button("Force close", async () => {
        await closeConnection(p.name);
        location.hash = "#/connections";
      }, { danger: true, ask: "Close this connection?" })),
      el("h2", {}, "Channels"), channels);
    return async () => {
      const c = await api("GET", `/connections/${enc(p.name)}`);
      details.replaceChildren(kv([
        ["User", c.user], ["Vhost", c.vhost], ["Peer", `${c.peer_host}:${c.peer_port}`], ["Protocol", c.protocol],
        ["Client", `${get(c, "client_properties.product") || ""} ${get(c, "client_properties.version") || ""}`],
        ["Channels", c.channels], ["Frame max", c.frame_max], ["Heartbeat (s)", c.timeout],
        ["Connected at", new Date(c.connected_at).toLocaleString()],
      ]));
      channels.replaceChildren(channelTable(await api("GET", `/connections/${enc(p.name)}/channels`)));
    };
  });

  function channelTable(rows) {
    return table([
      { label: "Channel", key: "name" }, { label: "User", key: "user" }, { label: "Vhost", key: "vhost" },
      { label: "Consumers", key: "consumer_count", num: true }, { label: "Unacked", key: "messages_unacknowledged", num: true },
      { label: "Prefetch", key: "prefetch_count", num: true }, { label: "Mode", render: (c) => (c.transactional ? "tx" : c.confirm ? "confirm" : "") },
    ], rows, "channels");
  }

  page("/channels", (main) => {
    const holder = el("div", {});
    main.append(el("h1", {}, "Channels"), holder);
    return async () => holder.replaceChildren(channelTable(await api("GET", "/channels")));
  });

  // ---- exchanges ---------------------------------------------------------

  page("/exchanges", async (main) => {
    const t = serverTable("/exchanges", [
      { label: "Vhost", key: "vhost" },
      { label: "Name", key: "name", render: exchangeLink },
      { label: "Type", key: "type" },
      { label: "Durable", key: "durable", render: (e) => (e.durable ? "D" : "") },
      { label: "Internal", key: "internal", render: (e) => (e.internal ? "I" : "") },
      { label: "Delayed", key: "messages_delayed", nosort: true, render: (e) => (e.messages_delayed ?? "") },
      { label: "Arguments", key: "arguments", nosort: true, render: (e) => JSON.stringify(e.arguments || {}) },
    ], { id: "exchanges" });
    const vhosts = await vhostNames();
    main.append(el("h1", {}, "Exchanges"), t.node, el("h2", {}, "Add an exchange"),
      form("add-exchange", [
        { name: "vhost", label: "Vhost", options: vhosts, value: vhosts[0] },
        { name: "name", label: "Name", required: true },
        { name: "type", label: "Type", options: ["direct", "fanout", "topic", "headers", "x-delayed-message"], value: "direct" },
        { name: "durable", label: "Durable", type: "checkbox", value: true },
        { name: "arguments", label: "Arguments (JSON)", value: "{}" },
      ], "Add exchange", (v) => api("PUT", `/exchanges/${enc(v.vhost)}/${enc(v.name)}`, {
        type: v.type, durable: v.durable, auto_delete: false, internal: false, arguments: JSON.parse(v.arguments || "{}"),
      })));
    return t.refresh;
  });

  function bindingTable(rows, id) {
    return table([
      { label: "Source", render: (b) => b.source || "(AMQP default)" },
      { label: "Destination", render: (b) => `${b.destination} (${b.destination_type})` },
      { label: "Routing key", key: "routing_key" },
      { label: "Arguments", render: (b) => JSON.stringify(b.arguments || {}) },
      { label: "", render: (b) => (b.source ? button("Unbind", () => api("DELETE",
        `/bindings/${enc(b.vhost)}/e/${enc(b.source)}/${b.destination_type === "queue" ? "q" : "e"}/${enc(b.destination)}/${enc(b.properties_key)}`), { danger: true }) : "") },
    ], rows, id);
  }

  page("/exchanges/:vhost/:name", (main, p) => {
    const details = el("div", {});
    const bindings = el("div", {});
    const published = el("p", { id: "publish-result" });
    const url = `/exchanges/${enc(p.vhost)}/${enc(p.name)}`;
    const isDefault = p.name === "amq.default";
    main.append(el("h1", {}, "Exchange ", isDefault ? "(AMQP default)" : p.name, el("span", { class: "muted" }, " in ", p.vhost)),
      details, el("h2", {}, "Bindings from this exchange"), bindings);
    if (!isDefault) {
      main.append(form("add-binding", [
        { name: "kind", label: "To", options: ["queue", "exchange"], value: "queue" },
        { name: "destination", label: "Destination", required: true },
        { name: "routing_key", label: "Routing key" },
      ], "Bind", (v) => api("POST", `/bindings/${enc(p.vhost)}/e/${enc(p.name)}/${v.kind === "queue" ? "q" : "e"}/${enc(v.destination)}`,
        { routing_key: v.routing_key, arguments: {} })));
    }
    main.append(el("h2", {}, "Publish a message"), publishForm(url, ""), published,
      isDefault ? "" : el("p", {}, button("Delete this exchange", async () => {
        await api("DELETE", url);
        location.hash = "#/exchanges";
      }, { danger: true, ask: `Delete exchange ${p.name}?` })));
    return async () => {
      const e = await api("GET", url);
      details.replaceChildren(kv([["Type", e.type], ["Durable", String(e.durable)], ["Auto-delete", String(e.auto_delete)],
        ["Internal", String(e.internal)], ["Arguments", JSON.stringify(e.arguments || {})]]));
      bindings.replaceChildren(bindingTable(isDefault ? [] : await api("GET", `${url}/bindings/source`), "exchange-bindings"));
    };
  });

  /** The publish form of an exchange (the default one for a queue page). */
  function publishForm(exchangeUrl, routingKey) {
    return form("publish", [
      { name: "routing_key", label: "Routing key", value: routingKey },
      { name: "delivery_mode", label: "Delivery mode", options: ["2 (persistent)", "1 (transient)"], value: "2 (persistent)" },
      { name: "headers", label: "Headers (JSON)", value: "{}" },
      { name: "payload", label: "Payload", type: "textarea" },
    ], "Publish message", async (v) => {
      const r = await api("POST", `${exchangeUrl}/publish`, {
        routing_key: v.routing_key, payload: v.payload, payload_encoding: "string",
        properties: { delivery_mode: Number(v.delivery_mode[0]), headers: JSON.parse(v.headers || "{}") },
      });
      const out = document.getElementById("publish-result");
      if (out) out.textContent = r.routed ? "Message published." : "Message published, but not routed to any queue.";
    });
  }

  // ---- queues ------------------------------------------------------------

  page("/queues", async (main) => {
    const t = serverTable("/queues", [
      { label: "Vhost", key: "vhost" },
      { label: "Name", key: "name", render: queueLink },
      { label: "Type", key: "type" },
      { label: "Features", nosort: true, render: (q) => [q.durable ? "D" : "", q.auto_delete ? "AD" : "", q.exclusive ? "Excl" : ""].filter(Boolean).join(" ") },
      { label: "Ready", key: "messages_ready", num: true },
      { label: "Unacked", key: "messages_unacknowledged", num: true },
      { label: "Total", key: "messages", num: true },
      { label: "Consumers", key: "consumers", num: true },
      { label: "Incoming /s", key: "message_stats.publish_details.rate", num: true },
      { label: "Deliver /s", key: "message_stats.deliver_get_details.rate", num: true },
      { label: "Ack /s", key: "message_stats.ack_details.rate", num: true },
    ], { id: "queues" });
    const vhosts = await vhostNames();
    main.append(el("h1", {}, "Queues"), t.node, el("h2", {}, "Add a queue"),
      form("add-queue", [
        { name: "vhost", label: "Vhost", options: vhosts, value: vhosts.includes("/") ? "/" : vhosts[0] },
        { name: "name", label: "Name", required: true },
        { name: "type", label: "Type", options: ["classic", "quorum"], value: "classic" },
        { name: "durable", label: "Durable", type: "checkbox", value: true },
        { name: "arguments", label: "Arguments (JSON)", value: "{}" },
      ], "Add queue", (v) => {
        const args = JSON.parse(v.arguments || "{}");
        if (v.type !== "classic") args["x-queue-type"] = v.type;
        return api("PUT", `/queues/${enc(v.vhost)}/${enc(v.name)}`, { durable: v.durable, auto_delete: false, arguments: args });
      }));
    return t.refresh;
  });

  page("/queues/:vhost/:name", (main, p) => {
    const url = `/queues/${enc(p.vhost)}/${enc(p.name)}`;
    const details = el("div", {});
    const depth = chart("Queued messages", ["ready", "unacked"], "chart-depth");
    const rates = chart("Message rates (per second)", ["publish", "deliver_get", "ack"], "chart-queue-rates");
    const consumers = el("div", {});
    const bindings = el("div", {});
    const got = el("div", { id: "got-messages" });
    main.append(
      el("h1", {}, "Queue ", p.name, el("span", { class: "muted" }, " in ", p.vhost)),
      details, depth.node, rates.node,
      el("h2", {}, "Consumers"), consumers,
      el("h2", {}, "Bindings"), bindings,
      form("add-queue-binding", [
        { name: "source", label: "From exchange", required: true },
        { name: "routing_key", label: "Routing key" },
      ], "Bind", (v) => api("POST", `/bindings/${enc(p.vhost)}/e/${enc(v.source)}/q/${enc(p.name)}`, { routing_key: v.routing_key, arguments: {} })),
      el("h2", {}, "Publish a message"),
      el("p", { class: "muted" }, "Published to the default exchange with this queue's name as the routing key."),
      publishForm(`/exchanges/${enc(p.vhost)}/amq.default`, p.name), el("p", { id: "publish-result" }),
      el("h2", {}, "Get messages"),
      el("p", { class: "muted" }, "Getting messages with a requeue mode puts them back (marked redelivered)."),
      form("get-messages", [
        { name: "ackmode", label: "Ack mode", options: ["ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false"], value: "ack_requeue_true" },
        { name: "encoding", label: "Encoding", options: ["auto", "base64"], value: "auto" },
        { name: "count", label: "Messages", type: "number", value: 1 },
      ], "Get messages", async (v) => {
        const msgs = await api("POST", `${url}/get`, { count: Number(v.count), ackmode: v.ackmode, encoding: v.encoding, truncate: 50000 });
        got.replaceChildren(msgs.length ? "" : el("p", { class: "muted" }, "Queue is empty."),
          ...msgs.map((m, i) => el("div", { class: "message" },
            kv([["Message", i + 1], ["Exchange", m.exchange || "(AMQP default)"], ["Routing key", m.routing_key],
              ["Redelivered", String(m.redelivered)], ["Remaining in queue", m.message_count],
              ["Properties", JSON.stringify(m.properties || {})], ["Payload encoding", m.payload_encoding],
              ["Payload bytes", m.payload_bytes]]),
            el("pre", { class: "payload" }, m.payload))));
      }),
      got,
      el("h2", {}, "Purge and delete"),
      el("p", { class: "toolbar" },
        button("Purge messages", () => api("DELETE", `${url}/contents`), { id: "purge", danger: true, ask: `Purge every ready message of ${p.name}?` }),
        button("Delete queue", async () => {
          await api("DELETE", url);
          location.hash = "#/queues";
        }, { id: "delete-queue", danger: true, ask: `Delete queue ${p.name}?` })),
    );
    return async () => {
      const q = await api("GET", url);
      details.replaceChildren(kv([
        ["Type", q.type], ["Durable", String(q.durable)], ["Auto-delete", String(q.auto_delete)], ["Exclusive", String(q.exclusive)],
        ["Arguments", JSON.stringify(q.arguments || {})], ["State", q.state],
        ["Messages", el("span", { id: "queue-messages" }, fmtNumber(q.messages))],
        ["Ready", el("span", { id: "queue-ready" }, fmtNumber(q.messages_ready))],
        ["Unacked", el("span", { id: "queue-unacked" }, fmtNumber(q.messages_unacknowledged))],
        ["Ready bytes", fmtBytes(q.message_bytes_ready)], ["Paged out", q.messages_paged_out], ["Consumers", q.consumers],
      ], "queue-details"));
      depth.add({ ready: q.messages_ready || 0, unacked: q.messages_unacknowledged || 0 });
      rates.add({ publish: rate(q, "publish"), deliver_get: rate(q, "deliver_get"), ack: rate(q, "ack") });
      const cs = (await api("GET", `/consumers/${enc(p.vhost)}`)).filter((c) => c.queue.name === p.name);
      consumers.replaceChildren(table([
        { label: "Tag", key: "consumer_tag" }, { label: "Ack required", render: (c) => String(c.ack_required) },
        { label: "Exclusive", render: (c) => String(c.exclusive) }, { label: "Prefetch", key: "prefetch_count", num: true },
      ], cs, "queue-consumers"));
      bindings.replaceChildren(bindingTable(await api("GET", `${url}/bindings`), "queue-bindings"));
    };
  });

  // ---- users, vhosts, permissions ----------------------------------------

  function adminOnly(main, what) {
    if (isAdmin()) return false;
    main.append(el("p", { class: "muted" }, `${what} need the administrator tag.`));
    return true;
  }

  page("/users", (main) => {
    main.append(el("h1", {}, "Users"));
    if (adminOnly(main, "Users")) return undefined;
    const users = el("div", {});
    const perms = el("div", {});
    main.append(users,
      el("h2", {}, "Add or update a user"),
      form("add-user", [
        { name: "name", label: "Name", required: true },
        { name: "password", label: "Password", type: "password" },
        { name: "tags", label: "Tags (comma-separated)", value: "management" },
      ], "Save user", (v) => api("PUT", `/users/${enc(v.name)}`, v.password ? { password: v.password, tags: v.tags } : { password_hash: "", tags: v.tags })),
      el("h2", {}, "Permissions"), perms,
      form("set-permission", [
        { name: "user", label: "User", required: true },
        { name: "vhost", label: "Vhost", value: "/" },
        { name: "configure", label: "Configure regex", value: ".*" },
        { name: "write", label: "Write regex", value: ".*" },
        { name: "read", label: "Read regex", value: ".*" },
      ], "Set permission", (v) => api("PUT", `/permissions/${enc(v.vhost)}/${enc(v.user)}`, { configure: v.configure, write: v.write, read: v.read })));
    return async () => {
      users.replaceChildren(table([
        { label: "Name", key: "name" }, { label: "Tags", render: (u) => (Array.isArray(u.tags) ? u.tags.join(", ") : u.tags) },
        { label: "Has password", render: (u) => (u.password_hash ? "yes" : "no") },
        { label: "", render: (u) => button("Delete", () => api("DELETE", `/users/${enc(u.name)}`), { danger: true, ask: `Delete user ${u.name}?` }) },
      ], await api("GET", "/users"), "users"));
      perms.replaceChildren(table([
        { label: "User", key: "user" }, { label: "Vhost", key: "vhost" }, { label: "Configure", key: "configure" },
        { label: "Write", key: "write" }, { label: "Read", key: "read" },
        { label: "", render: (x) => button("Clear", () => api("DELETE", `/permissions/${enc(x.vhost)}/${enc(x.user)}`), { danger: true }) },
      ], await api("GET", "/permissions"), "permissions"));
    };
  });

  page("/vhosts", (main) => {
    const list = el("div", {});
    main.append(el("h1", {}, "Virtual hosts"), list);
    if (isAdmin()) {
      main.append(el("h2", {}, "Add a virtual host"),
        form("add-vhost", [{ name: "name", label: "Name", required: true }], "Add vhost", (v) => api("PUT", `/vhosts/${enc(v.name)}`, {})));
    }
    return async () => {
      list.replaceChildren(table([
        { label: "Name", key: "name" },
        { label: "", render: (v) => (isAdmin() ? button("Delete", () => api("DELETE", `/vhosts/${enc(v.name)}`), { danger: true, ask: `Delete vhost ${v.name} and everything in it?` }) : "") },
      ], await api("GET", "/vhosts"), "vhosts"));
    };
  });

  // ---- policies ----------------------------------------------------------

  page("/policies", (main) => {
    const list = el("div", {});
    const operator = el("div", {});
    main.append(el("h1", {}, "Policies"), list, el("h2", {}, "Operator policies"), operator);
    const show = async (holder, path, id) => {
      try {
        holder.replaceChildren(table([
          { label: "Vhost", key: "vhost" }, { label: "Name", key: "name" }, { label: "Pattern", key: "pattern" },
          { label: "Apply to", key: "apply-to" }, { label: "Priority", key: "priority", num: true },
          { label: "Definition", render: (x) => JSON.stringify(x.definition || {}) },
        ], await api("GET", path), id));
      } catch (e) {
        // No fake data: what the server said, as it said it.
        holder.replaceChildren(el("p", { class: "error", id: id + "-error" }, "Policies are not available: " + e.message));
      }
    };
    return async () => {
      await show(list, "/policies", "policies");
      await show(operator, "/operator-policies", "operator-policies");
    };
  });

  // ---- definitions -------------------------------------------------------

  page("/definitions", (main) => {
    main.append(el("h1", {}, "Definitions"));
    if (adminOnly(main, "Definitions")) return undefined;
    const result = el("pre", { class: "payload", id: "import-result", hidden: true });
    const file = el("input", { type: "file", accept: "application/json,.json", id: "import-file" });
    main.append(
      el("h2", {}, "Export"),
      el("p", {}, "Users (with password hashes), vhosts, permissions, queues, exchanges and bindings, in RabbitMQ's format."),
      button("Download definitions", async () => {
        const defs = await api("GET", "/definitions");
        const blob = new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" });
        const a = el("a", { href: URL.createObjectURL(blob), download: `berth-definitions-${new Date().toISOString().slice(0, 10)}.json` });
        document.body.append(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(a.href), 10000);
      }, { id: "export" }),
      el("h2", {}, "Import"),
      el("p", {}, "A definitions file exported by berth or RabbitMQ. What berth does not import is listed, never dropped silently."),
      el("p", { class: "toolbar" }, file, button("Upload definitions", async () => {
        if (!file.files.length) throw new Berth.ApiError(0, "choose a file first");
        const defs = JSON.parse(await file.files[0].text());
        const r = await api("POST", "/definitions", defs);
        result.hidden = false;
        result.textContent = JSON.stringify(r, null, 2);
      }, { id: "import" })),
      result,
    );
    return undefined;
  });
})();
