//! `csi node ...`: the Node service's calls.

use std::collections::HashMap;

use clap::Subcommand;
use csi_client::CsiClient;
use csi_proto::v1::*;

use crate::args::{CapabilityArgs, ContextArgs, SizeArgs, VolumePathArgs, to_map};
use crate::output::Format;
use crate::{Failure, show};

#[derive(Debug, Subcommand)]
pub(crate) enum NodeCmd {
    /// NodeStageVolume.
    Stage {
        /// The volume id.
        volume_id: String,
        /// Where to stage.
        #[arg(long)]
        staging_path: String,
        #[command(flatten)]
        cap: CapabilityArgs,
        #[command(flatten)]
        contexts: ContextArgs,
    },
    /// NodeUnstageVolume.
    Unstage {
        /// The volume id.
        volume_id: String,
        /// Where it is staged.
        #[arg(long)]
        staging_path: String,
    },
    /// NodePublishVolume.
    Publish {
        /// The volume id.
        volume_id: String,
        /// Where to publish.
        #[arg(long)]
        target_path: String,
        /// Where it is staged (when the driver stages).
        #[arg(long, default_value = "")]
        staging_path: String,
        /// Publish read-only.
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        cap: CapabilityArgs,
        #[command(flatten)]
        contexts: ContextArgs,
    },
    /// NodeUnpublishVolume.
    Unpublish {
        /// The volume id.
        volume_id: String,
        /// Where it is published.
        #[arg(long)]
        target_path: String,
    },
    /// NodeGetVolumeStats.
    Stats {
        /// The volume id.
        volume_id: String,
        #[command(flatten)]
        paths: VolumePathArgs,
    },
    /// NodeExpandVolume.
    Expand {
        /// The volume id.
        volume_id: String,
        #[command(flatten)]
        paths: VolumePathArgs,
        #[command(flatten)]
        size: SizeArgs,
    },
    /// NodeGetInfo.
    Info,
    /// NodeGetCapabilities.
    Capabilities,
}

pub(crate) async fn run(
    client: &CsiClient,
    cmd: NodeCmd,
    out: Format,
    secrets: HashMap<String, String>,
) -> Result<(), Failure> {
    match cmd {
        NodeCmd::Stage {
            volume_id,
            staging_path,
            cap,
            contexts,
        } => show!(
            out,
            client,
            NodeStageVolumeRequest {
                volume_id,
                publish_context: to_map(&contexts.publish_context),
                staging_target_path: staging_path,
                volume_capability: Some(cap.capability()),
                secrets,
                volume_context: to_map(&contexts.volume_context),
            }
        ),
        NodeCmd::Unstage {
            volume_id,
            staging_path,
        } => show!(
            out,
            client,
            NodeUnstageVolumeRequest {
                volume_id,
                staging_target_path: staging_path
            }
        ),
        NodeCmd::Publish {
            volume_id,
            target_path,
            staging_path,
            readonly,
            cap,
            contexts,
        } => {
            show!(
                out,
                client,
                NodePublishVolumeRequest {
                    volume_id,
                    publish_context: to_map(&contexts.publish_context),
                    staging_target_path: staging_path,
                    target_path,
                    volume_capability: Some(cap.capability()),
                    readonly,
                    secrets,
                    volume_context: to_map(&contexts.volume_context),
                }
            )
        }
        NodeCmd::Unpublish {
            volume_id,
            target_path,
        } => show!(
            out,
            client,
            NodeUnpublishVolumeRequest {
                volume_id,
                target_path
            }
        ),
        NodeCmd::Stats { volume_id, paths } => show!(
            out,
            client,
            NodeGetVolumeStatsRequest {
                volume_id,
                volume_path: paths.volume_path,
                staging_target_path: paths.staging_path,
            }
        ),
        NodeCmd::Expand {
            volume_id,
            paths,
            size,
        } => show!(
            out,
            client,
            NodeExpandVolumeRequest {
                volume_id,
                volume_path: paths.volume_path,
                capacity_range: size.range(),
                staging_target_path: paths.staging_path,
                volume_capability: None,
                secrets,
            }
        ),
        NodeCmd::Info => show!(out, client, NodeGetInfoRequest {}),
        NodeCmd::Capabilities => show!(out, client, NodeGetCapabilitiesRequest {}),
    }
    Ok(())
}
