//! The one authorization boundary of a replica.
//!
//! Every request to every service of the replica passes [`AuthLayer`]
//! first. It derives the caller's [`Caller`] once, from the client
//! certificate's names (`longhaul_core::identity`), checks it against the
//! RPC's [`Access`] rule and hands it to the handler in the request's
//! extensions; a refusal is PERMISSION_DENIED before any handler runs.
//!
//! | what                                             | who                                   |
//! |--------------------------------------------------|---------------------------------------|
//! | raft transport                                   | replicas                              |
//! | membership, links, jobs (operator writes)        | operators; replicas forwarding one    |
//! | reads, plans, watches, health, reflection        | any certificate with a role           |
//! | agent calls                                      | that site's agent; replicas forwarding|
//! | anything carrying the forwarding header          | replicas only                         |
//! | a method not in the table                        | nobody                                |
//!
//! That an agent speaks only for its own site is checked by the agent
//! service against the site the request names, with [`check_site`] and the
//! caller found here. Without TLS there is no identity to check: every
//! request passes, and the replica said so loudly when it started.

use std::task::{Context, Poll};

use longhaul_core::identity::Roles;
use longhaul_core::limits;
use tonic::Status;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::forward::FORWARDED;

/// Who sent a request, as the boundary established it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The replica serves without TLS: nobody is authenticated.
    Plaintext,
    /// A client certificate from the cluster's CA, and the roles it names.
    Certified(Roles),
}

/// What an RPC requires of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Replicas only.
    Replica,
    /// Operators, or a replica forwarding an operator's request it checked.
    Operator,
    /// A site's agent (which site: the handler checks), or a replica
    /// forwarding an agent's request it checked.
    Site,
    /// Any certificate that names a role.
    AnyRole,
}

/// The rule for the gRPC method at `path` (`/package.Service/Method`);
/// `None` for a method nobody may call.
pub fn access(path: &str) -> Option<Access> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    Some(match service {
        "longhaul.v1.RaftTransport" => Access::Replica,
        "longhaul.v1.AgentService" => Access::Site,
        "longhaul.v1.Coordinator" => match method {
            "AddMember" | "RemoveMember" | "TransferLeader" | "PutLink" | "SubmitJob"
            | "CancelJob" => Access::Operator,
            "GetCluster" | "ListSites" | "GetSite" | "ListLinks" | "GetJob" | "ListJobs"
            | "Plan" | "GetSyncSchedule" | "ListRounds" | "Watch" => Access::AnyRole,
            _ => return None,
        },
        "grpc.health.v1.Health"
        | "grpc.reflection.v1.ServerReflection"
        | "grpc.reflection.v1alpha.ServerReflection" => Access::AnyRole,
        _ => return None,
    })
}

/// Whether `caller` may call the method at `path`, with or without the
/// forwarding header; the refusal says who may.
pub fn authorize(path: &str, forwarded: bool, caller: &Caller) -> Result<(), Status> {
    let Caller::Certified(roles) = caller else {
        return Ok(());
    };
    let refuse = |why: String| {
        metrics::counter!("longhaul_requests_refused_total", "reason" => "authorization")
            .increment(1);
        Err(Status::permission_denied(limits::shorten(format!(
            "{}: the client certificate grants {}; {why}",
            limits::quote(path),
            roles.describe()
        ))))
    };
    if forwarded && !roles.replica {
        return refuse("only a replica may forward a request".into());
    }
    let allowed = match access(path) {
        None => return refuse("this method is not served".into()),
        Some(Access::Replica) => roles.replica,
        Some(Access::Operator) => roles.operator || (roles.replica && forwarded),
        Some(Access::Site) => !roles.sites.is_empty() || (roles.replica && forwarded),
        Some(Access::AnyRole) => roles.replica || roles.operator || !roles.sites.is_empty(),
    };
    if allowed {
        return Ok(());
    }
    refuse(match access(path) {
        Some(Access::Replica) => "only replicas may call it".into(),
        Some(Access::Operator) => "only operators may call it".into(),
        Some(Access::Site) => "only site agents may call it".into(),
        Some(Access::AnyRole) | None => "a certificate must name a role".into(),
    })
}

/// The caller of a request arriving with these extensions at a replica that
/// serves TLS (`tls`) or not: the roles of its certificate with TLS,
/// [`Caller::Plaintext`] without. With TLS, a request without the
/// connection's TLS information is refused, not let through.
pub fn caller_of(extensions: &http::Extensions, tls: bool) -> Result<Caller, Status> {
    if !tls {
        return Ok(Caller::Plaintext);
    }
    let Some(info) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() else {
        return Err(Status::unauthenticated(
            "the connection carries no TLS information to authenticate the caller by",
        ));
    };
    let certs = info
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let cert = webpki::EndEntityCert::try_from(leaf).map_err(|e| {
        Status::unauthenticated(format!("the client certificate cannot be parsed: {e:?}"))
    })?;
    Ok(Caller::Certified(Roles::from_dns_names(
        cert.valid_dns_names(),
    )))
}

/// Refuses a request about `site` unless its caller is that site's agent,
/// or a replica that forwards it (the boundary let only replicas forward,
/// and the forwarding replica checked the site itself).
pub fn check_site<T>(request: &tonic::Request<T>, site: &str) -> Result<(), Status> {
    let roles = match request.extensions().get::<Caller>() {
        Some(Caller::Plaintext) => return Ok(()),
        Some(Caller::Certified(roles)) => roles,
        // Every request passes the boundary, which records the caller.
        None => return Err(Status::internal("the request bypassed authorization")),
    };
    if roles.sites.iter().any(|s| s == site) {
        return Ok(());
    }
    if roles.replica && request.metadata().contains_key(FORWARDED) {
        return Ok(());
    }
    metrics::counter!("longhaul_agent_requests_refused_total", "reason" => "identity").increment(1);
    Err(Status::permission_denied(limits::shorten(format!(
        "field `site_id`: the client certificate grants {}; it may not speak for site {}",
        roles.describe(),
        limits::quote(site)
    ))))
}

/// The boundary as a tower layer around all of a replica's services.
#[derive(Debug, Clone, Copy)]
pub struct AuthLayer {
    /// The replica serves TLS: every caller must be authenticated.
    pub tls: bool,
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = Authorized<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorized {
            inner,
            tls: self.tls,
        }
    }
}

/// A service behind the boundary.
#[derive(Debug, Clone)]
pub struct Authorized<S> {
    inner: S,
    tls: bool,
}

impl<S, B> Service<http::Request<B>> for Authorized<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let forwarded = request.headers().contains_key(FORWARDED);
        let decided = caller_of(request.extensions(), self.tls).and_then(|caller| {
            authorize(request.uri().path(), forwarded, &caller).map(|()| caller)
        });
        match decided {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                // The clone that was polled ready serves this call.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(inner.call(request))
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certified(replica: bool, operator: bool, sites: &[&str]) -> Caller {
        Caller::Certified(Roles {
            replica,
            operator,
            sites: sites.iter().map(|s| s.to_string()).collect(),
        })
    }

    #[test]
    fn every_rpc_of_every_service_has_a_rule_and_unknown_ones_have_none() {
        let set = <prost_types::FileDescriptorSet as prost::Message>::decode(
            longhaul_proto::v1::FILE_DESCRIPTOR_SET,
        )
        .unwrap();
        let mut methods = 0;
        {
            for file in set.file {
                // The services a replica serves (the descriptor set also holds the agent's own).
                for svc in file.service.into_iter().filter(|svc| {
                    matches!(
                        svc.name.as_deref(),
                        Some("Coordinator" | "AgentService" | "RaftTransport")
                    )
                }) {
                    for method in svc.method {
                        let path = format!(
                            "/{}.{}/{}",
                            file.package.as_deref().unwrap_or_default(),
                            svc.name.as_deref().unwrap_or_default(),
                            method.name.as_deref().unwrap_or_default()
                        );
                        assert!(access(&path).is_some(), "{path} has no rule");
                        methods += 1;
                    }
                }
            }
        }
        assert!(methods >= 20, "{methods} methods");
        assert_eq!(access("/longhaul.v1.Coordinator/DropEverything"), None);
        assert_eq!(access("/other.Service/Method"), None);
        assert_eq!(access("garbage"), None);
    }

    #[test]
    fn each_role_reaches_only_its_rpcs() {
        let replica = certified(true, false, &[]);
        let operator = certified(false, true, &[]);
        let north = certified(false, false, &["north"]);
        let nobody = certified(false, false, &[]);
        let raft = "/longhaul.v1.RaftTransport/Send";
        let submit = "/longhaul.v1.Coordinator/SubmitJob";
        let read = "/longhaul.v1.Coordinator/ListSites";
        let register = "/longhaul.v1.AgentService/Register";
        let cases = [
            (raft, false, &replica, true),
            (raft, false, &operator, false),
            (raft, false, &north, false),
            (submit, false, &operator, true),
            (submit, false, &replica, false),
            (submit, true, &replica, true),
            (submit, false, &north, false),
            (submit, true, &operator, false),
            (read, false, &north, true),
            (read, false, &operator, true),
            (read, false, &nobody, false),
            (register, false, &north, true),
            (register, false, &operator, false),
            (register, false, &replica, false),
            (register, true, &replica, true),
            (register, true, &north, false),
            ("/longhaul.v1.Coordinator/Nope", false, &operator, false),
        ];
        for (path, forwarded, caller, allowed) in cases {
            let outcome = authorize(path, forwarded, caller);
            assert_eq!(
                outcome.is_ok(),
                allowed,
                "{path} forwarded={forwarded} {caller:?}"
            );
            if let Err(status) = outcome {
                assert_eq!(status.code(), tonic::Code::PermissionDenied);
            }
        }
        assert!(authorize(submit, true, &Caller::Plaintext).is_ok());
    }

    #[test]
    fn with_tls_a_request_without_connection_information_is_refused() {
        let none = http::Extensions::new();
        assert_eq!(caller_of(&none, false).unwrap(), Caller::Plaintext);
        assert_eq!(
            caller_of(&none, true).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }
}
