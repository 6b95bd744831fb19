//! The two etcd v3 RPCs the benchmark needs, written by hand: `KV/Put` and
//! `Maintenance/Status` from etcd's `etcdserverpb/rpc.proto` (field numbers
//! as in etcd 3.4; unknown fields are skipped by prost). Called through
//! tonic's generic client, so no code generation and no second tonic.

use tonic::Status;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(uint64, tag = "4")]
    pub leader: u64,
}

/// A client of one etcd member (or of whichever member the channel reaches).
#[derive(Debug, Clone)]
pub struct EtcdClient {
    grpc: Grpc<Channel>,
}

impl EtcdClient {
    pub fn new(channel: Channel) -> Self {
        Self {
            grpc: Grpc::new(channel),
        }
    }

    async fn unary<Req, Resp>(
        &mut self,
        path: &'static str,
        request: tonic::Request<Req>,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("etcd connection: {e}")))?;
        let response = self
            .grpc
            .unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::<Req, Resp>::default(),
            )
            .await?;
        Ok(response.into_inner())
    }

    pub async fn put(
        &mut self,
        request: tonic::Request<PutRequest>,
    ) -> Result<PutResponse, Status> {
        self.unary("/etcdserverpb.KV/Put", request).await
    }

    pub async fn status(
        &mut self,
        request: tonic::Request<StatusRequest>,
    ) -> Result<StatusResponse, Status> {
        self.unary("/etcdserverpb.Maintenance/Status", request)
            .await
    }
}
