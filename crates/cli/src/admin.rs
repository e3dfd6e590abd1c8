//! `berth user|vhost|permissions`: manage users, vhosts and permissions of
//! a running broker through its HTTP API (so it works remotely too), as
//! `rabbitmqctl add_user` / `add_vhost` / `set_permissions` do.
//!
//! The client is a minimal blocking HTTP/1.1 exchange (one request per
//! connection, `Connection: close`, bounded by a timeout): the CLI needs
//! nothing more.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use base64::Engine;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Time allowed to connect to the API and for its answer.
const HTTP_TIMEOUT_MS: u64 = 10_000;
/// Largest answer read (a user or permission listing).
const RESPONSE_BYTES_MAX: u64 = 64 << 20;

/// Where the broker's HTTP API is and who we are there.
#[derive(Args, Debug)]
pub struct ApiArgs {
    /// The broker's HTTP API: http://HOST:PORT (net.http_listen of the
    /// broker) or https://HOST:PORT (net.https_listen).
    #[arg(
        long,
        global = true,
        env = "BERTH_URL",
        default_value = "http://127.0.0.1:15672"
    )]
    url: String,
    /// An administrator's user name.
    #[arg(long, global = true, env = "BERTH_USERNAME", default_value = "guest")]
    username: String,
    /// Its password.
    #[arg(
        long,
        global = true,
        env = "BERTH_PASSWORD",
        default_value = "guest",
        hide_env_values = true
    )]
    password: String,
    /// CA certificates (PEM) that an https --url's server certificate is
    /// verified against; default: the system's CA bundle.
    #[arg(long, global = true, env = "BERTH_CA_FILE", value_name = "FILE")]
    ca_file: Option<std::path::PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create a user (tags: comma-separated, e.g. administrator).
    Add {
        name: String,
        #[arg(value_name = "PASSWORD")]
        new_password: String,
        #[arg(long, default_value = "")]
        tags: String,
    },
    /// Change a user's password (keeps its tags).
    Passwd {
        name: String,
        #[arg(value_name = "PASSWORD")]
        new_password: String,
    },
    /// Delete a user and its permissions.
    Delete { name: String },
    /// List users and their tags.
    List,
}

#[derive(Subcommand, Debug)]
pub enum VhostCommand {
    /// Create a vhost.
    Add { name: String },
    /// Delete a vhost: closes its connections, removes its queues and
    /// exchanges.
    Delete { name: String },
    /// List vhosts.
    List,
}

#[derive(Subcommand, Debug)]
pub enum PermissionsCommand {
    /// Set a user's configure, write and read patterns in a vhost.
    Set {
        user: String,
        configure: String,
        write: String,
        read: String,
        #[arg(long, default_value = "/")]
        vhost: String,
    },
    /// Remove a user's permissions in a vhost.
    Clear {
        user: String,
        #[arg(long, default_value = "/")]
        vhost: String,
    },
    /// List permissions (of one vhost with --vhost).
    List {
        #[arg(long)]
        vhost: Option<String>,
    },
}

/// `berth user ...`.
#[derive(Args, Debug)]
pub struct UserArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    command: UserCommand,
}

/// `berth vhost ...`.
#[derive(Args, Debug)]
pub struct VhostArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    command: VhostCommand,
}

/// `berth permissions ...`.
#[derive(Args, Debug)]
pub struct PermissionsArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    command: PermissionsCommand,
}

/// Percent-encodes one path segment (a vhost `/` becomes `%2F`).
fn seg(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl ApiArgs {
    /// One request; returns the JSON answer (Null for none) or an error
    /// saying what the broker answered.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, String> {
        let timeout = Duration::from_millis(HTTP_TIMEOUT_MS);
        let (status, value) = self.request(method, path, body, timeout)?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        let reason = value
            .get("reason")
            .and_then(Value::as_str)
            .map_or_else(|| value.to_string(), str::to_owned);
        Err(format!("{method} {path}: HTTP {status}: {reason}"))
    }

    /// One request, bounded by `timeout`; returns the HTTP status and the
    /// JSON answer (Null for none), whatever the status.
    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<(u16, Value), String> {
        let (tls, rest) = if let Some(rest) = self.url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = self.url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!(
                "--url must start with http:// or https:// (got {})",
                self.url
            ));
        };
        let (host_port, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let addr = host_port
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {host_port}: {e}"))?
            .next()
            .ok_or_else(|| format!("{host_port} has no address"))?;
        let tcp = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
            format!("cannot reach the broker's HTTP API at {}: {e} (is it started with --http-listen or --https-listen? set --url)", self.url)
        })?;
        tcp.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        tcp.set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let mut s: Box<dyn crate::https_client::Stream> = if tls {
            let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
            crate::https_client::wrap(tcp, host, self.ca_file.as_deref())?
        } else {
            Box::new(tcp)
        };
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.username, self.password));
        let payload = body.map(Value::to_string).unwrap_or_default();
        let req = format!(
            "{method} {base}{path} HTTP/1.1\r\nHost: {host_port}\r\nAuthorization: Basic {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
            payload.len()
        );
        s.write_all(req.as_bytes())
            .map_err(|e| format!("cannot send the request: {e}"))?;
        let mut raw = Vec::new();
        s.take(RESPONSE_BYTES_MAX)
            .read_to_end(&mut raw)
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("not an HTTP answer from {}", self.url))?;
        let value = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()))
        };
        Ok((status, value))
    }
}

fn rows(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

fn field<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

pub fn user(args: &UserArgs) -> Result<(), String> {
    let api = &args.api;
    match &args.command {
        UserCommand::Add {
            name,
            new_password,
            tags,
        } => {
            api.call(
                "PUT",
                &format!("/api/users/{}", seg(name)),
                Some(&json!({"password": new_password, "tags": tags})),
            )?;
            println!("user '{name}' added");
        }
        UserCommand::Passwd { name, new_password } => {
            let u = api.call("GET", &format!("/api/users/{}", seg(name)), None)?;
            let tags = u.get("tags").cloned().unwrap_or(Value::Null);
            api.call(
                "PUT",
                &format!("/api/users/{}", seg(name)),
                Some(&json!({"password": new_password, "tags": tags})),
            )?;
            println!("password of user '{name}' changed");
        }
        UserCommand::Delete { name } => {
            api.call("DELETE", &format!("/api/users/{}", seg(name)), None)?;
            println!("user '{name}' deleted");
        }
        UserCommand::List => {
            for u in rows(&api.call("GET", "/api/users", None)?) {
                let tags: Vec<&str> = rows(u.get("tags").unwrap_or(&Value::Null))
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                println!("{}\t[{}]", field(u, "name"), tags.join(", "));
            }
        }
    }
    Ok(())
}

pub fn vhost(args: &VhostArgs) -> Result<(), String> {
    let api = &args.api;
    match &args.command {
        VhostCommand::Add { name } => {
            api.call("PUT", &format!("/api/vhosts/{}", seg(name)), None)?;
            println!("vhost '{name}' added");
        }
        VhostCommand::Delete { name } => {
            api.call("DELETE", &format!("/api/vhosts/{}", seg(name)), None)?;
            println!("vhost '{name}' deleted");
        }
        VhostCommand::List => {
            for v in rows(&api.call("GET", "/api/vhosts", None)?) {
                println!("{}", field(v, "name"));
            }
        }
    }
    Ok(())
}

pub fn permissions(args: &PermissionsArgs) -> Result<(), String> {
    let api = &args.api;
    match &args.command {
        PermissionsCommand::Set {
            user,
            configure,
            write,
            read,
            vhost,
        } => {
            api.call(
                "PUT",
                &format!("/api/permissions/{}/{}", seg(vhost), seg(user)),
                Some(&json!({"configure": configure, "write": write, "read": read})),
            )?;
            println!("permissions of user '{user}' in vhost '{vhost}' set");
        }
        PermissionsCommand::Clear { user, vhost } => {
            api.call(
                "DELETE",
                &format!("/api/permissions/{}/{}", seg(vhost), seg(user)),
                None,
            )?;
            println!("permissions of user '{user}' in vhost '{vhost}' cleared");
        }
        PermissionsCommand::List { vhost } => {
            let path = vhost.as_ref().map_or_else(
                || "/api/permissions".to_owned(),
                |v| format!("/api/vhosts/{}/permissions", seg(v)),
            );
            println!("vhost\tuser\tconfigure\twrite\tread");
            for p in rows(&api.call("GET", &path, None)?) {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    field(p, "vhost"),
                    field(p, "user"),
                    field(p, "configure"),
                    field(p, "write"),
                    field(p, "read")
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::seg;

    #[test]
    fn the_default_vhost_is_percent_encoded_in_paths() {
        assert_eq!(seg("/"), "%2F");
        assert_eq!(seg("a b"), "a%20b");
        assert_eq!(seg("app-1.x"), "app-1.x");
    }
}
