"""Each package's public names, pinned: adding or removing one is a deliberate change
(httpx's test_exported_members). Private modules (``_x``) may change freely."""

from __future__ import annotations

import importlib
import types

import pytest

PUBLIC: dict[str, str] = {
    "gateway.errors": (
        "ConfigError GatewayError "
    ),
    "gateway.transport": (
        "ACCEPT_BACKOFF AlpnPolicy Endpoint Inherited ListenError ListenerFailed NNRP_ALPN "
        "PacketTransport QuicClientOptions QuicSettings READ_SIZE SharedListener "
        "StreamTransport TRANSPORT_IDS TextMessageError TlsConfig TlsFileError "
        "WebSocketRefused WebSocketTransport accept_failure_is_terminal bind_shared "
        "bound_uri connect "
        "describe_peer fleet_uri format_host load_tls open_unix_listener parse_endpoint peer_address "
        "read_until_closed server_context stream_credentials tune_tcp "
    ),
    "gateway.transport.quic": (
        "QuicClientTransport QuicConnectError QuicEndpoint QuicListener QuicPeer QuicStats "
        "QuicTransport RoutingTable client_configuration feed_datagram open_quic_transport "
        "server_configuration "
    ),
    "gateway.nnrp": (
        "AbandonCause Abort Backpressure Binding Body Budget BudgetFlag BudgetPolicy BudgetRequested "
        "BudgetUpdate CacheAck CacheAckStatus CacheInvalidate CacheInvalidateScope CacheMiss "
        "CacheLimits CacheMissReason CacheMissed CacheObjectKind CachePut CacheReference "
        "CacheReuseScope CacheTable Cancel "
        "CancelFlag CancelSource CapabilitiesNegotiated CapabilityFlag CapabilityNegotiation "
        "ClientConnection ClientEvent ClientHello ClientState Close CloseAckStatus CloseReason "
        "ConnState ConnectionFailed ControlReason CreditUpdate DEFAULT_MAX_PACKET "
        "DESCRIPTOR_LEN Deadline DeadlineUpdated Decoder DegradeProfile DescriptorFlag DropFlag "
        "DropReason DropReceived Elsewhere Error ErrorCode ErrorReceived ErrorRecoverable "
        "ErrorScope Event ExecutionHint ExpireAt Expiry ExpiryKind FAULTS FieldSpec "
        "FleetIdentity FleetKeyError FleetKeys FlowBackpressure FlowChanged FlowControl "
        "FlowFlag FlowReason FlowScope FlowUpdate ForwardOutcome FrameCancel FrameIgnored "
        "FrameShape FrameSubmit HEADER_FLAG_MASK HEADER_LEN HandedOff HandshakeCompleted Header "
        "HeaderFlag HelloAcked HintFlag HolderProbed HttpAnswerError InFlightPolicy InputProfile "
        "Journal "
        "KNOWN_TOKENS LegacyDescriptor LocalProtocolError Lookup LossTolerance MAGIC "
        "MAX_RUNS MESSAGE_CLASSES MIGRATION_REFUSED MIN_KEY_BYTES MemoryLocationHint Message "
        "MigrateAccept MsgType NotGranted OPENAI_EVENT_FRAME ObjectDeclare ObjectDelta "
        "ObjectBytes ObjectDeltaFlag ObjectFault ObjectLimits ObjectPatch ObjectRef ObjectRefFlag "
        "ObjectReference ObjectRefusal ObjectRelease ObjectReleaseFlag ObjectReleaseReason "
        "ObjectTable OpState OpenedForward OperationAbandoned OperationCancelled "
        "OperationResumed OperationSubmitted OperationSuperseding OtherReceived OwnershipHint "
        "PACKET_COST PAYLOAD_KIND_MASK PRELUDE_LEN PROTOCOL_MAX_PACKET Packet PartialFlag "
        "PartialReceived PartialResult PatchAckStatus PatchRejectReason PayloadKind PeerClosed "
        "PeerCredentials PeerError Phase Ping Pong Prelude PressureFlag PressureLevel "
        "PressureReason PriorityClass PriorityRequested PriorityUpdate Progress ProtocolError "
        "PutOutcome "
        "RECORD_COST RecoverableFlag RefusalReason Released RemoteProtocolError RepeatReceived "
        "Replay ReplayGap RequestKeyWanted ResubmissionRead ResubmissionRule ResultClass ResultDrop "
        "ResultDropReason ResultFlag ResultHint ResultHintBudgetPolicy ResultHintCongestion "
        "ResultHintReason ResultPush ResultReceived ResumeGrant ResumePolicy ResumeRecord "
        "ResumeStats RetryAfter RetryScopeFlag Role Route RouteHint RuntimeObjectKind "
        "SESSION_PATCH_FIELDS SPILL_SLICE STAGE_VENDOR_BASE SameBytes SchedulingFlag SealedForward "
        "SendBytes ServerConfig ServerConnection ServerHelloAck ServerSession SessionAckFlag "
        "SessionBook SessionClose SessionCloseAck SessionCloseAcked SessionCloseRequested "
        "SessionError SessionFlag SessionIds SessionMigrate SessionMigrateAck SessionMigrated "
        "SessionOpen SessionOpenAck SessionOpenAnswered SessionOpenRefused SessionOpenStatus "
        "SessionOpened SessionPatch SessionPatchAck SessionPatchField SessionResumed "
        "SessionState SessionTaken SessionsLost SpillMap SpillMemory Stage StandardProfile "
        "StreamSemantics "
        "SubmitMode SubmitRefused Supersede SupersedeFlag TOKEN_SCHEMA_ID TOKEN_SCHEMA_VERSION "
        "TOKEN_TEXT_FRAME TileIndexMode TraceContext TraceContextUpdated TraceFlag TraceInfo "
        "TransportId TransportProbe TransportProbeAck TypedBody TypedBodyError TypedDescriptor "
        "TypedFrame VERSION_MAJOR VIEW_MIN_BODY WIRE_FORMAT Wakeable Window WireMessage "
        "check_object_references decode_packet encode encode_openai_submit "
        "encode_partial_result forward_head_size forward_rest_size key_material message_type "
        "pack_single_frame pack_tokens pack_typed_body parse_tokens parse_typed_body "
        "spill_digest_update spill_release spill_sha256 "
        "split_packets unpack_legacy_descriptors unpack_object_references "
    ),
    "gateway.profile": (
        "CANCEL_CAUSES CAPABILITIES_OPERATION CHAT_COMPLETIONS DEFAULT_MAX_ENVELOPE_BYTES "
        "DEFAULT_MAX_MEDIA_BYTES Drop "
        "END_TABLE ERROR_CAUSES EXTENSIONS EndCause EndSpec Envelope KNOWN_OPERATIONS Listener "
        "MEDIA_EXTENSIONS MediaCapabilities MediaFrame MediaPlan MediaSlot NnrpPolicy Outcome ProfileError Push RUNTIME_TOKENS "
        "EnvelopeResubmission SCHEMA_VERSION Silent SubmitBody TOKEN_COMPLETION "
        "Terminal capability_document events is_token_request media_frames parse_envelope "
        "plan_media read_envelope read_envelope_steps read_typed_body runtime_tokens sniff "
        "token_prompt "
    ),
    "gateway.upstream": (
        "BINDINGS Binding CHAT_PATH ChunkParser ChunkStream Completion ENGINE_DEAD_MESSAGE "
        "LoadDecision LoadError LoadMonitor LoadPolicy LoadSample LoadSource LoadState "
        "PRIORITY_HEADER RefusalReason RefuseReason RequestBody RequestFieldError ResponseShape "
        "SSEDecoder "
        "SSEError SSEEvent SUPPORTED_BAND SlotHolder Standing TEXT_COMPLETION_PATH "
        "UnsupportedVersion UpstreamConfig UpstreamError UpstreamMalformed UpstreamOverloaded "
        "UpstreamStatus UpstreamTimeout UpstreamUnavailable VllmClient VllmInfo check_chunk "
        "classify_refusal decide engine_dead is_streaming lax_bool lax_int observe_reads "
        "output_token_limit "
        "parse_chunk parse_completion parse_load parse_metrics refusal_of select_binding "
        "to_profile_error usage_requested "
    ),
    "gateway.pipeline": (
        "ChatPipeline MEDIA_DIR_CAPACITY MediaDelivery MediaDirectory PipelineLimits PlainDelta Translator "
        "UpstreamRequest "
        "build_request plain_blocks_of plain_delta_mode profile_refusal "
        "token_count traceparent upstream_traceparent vllm_priority "
    ),
    "gateway.server": (
        "AuthSourceError BoundEndpoint CancelInfo Connection ConnectionLimits GatewayServer Observer "
        "Operation "
        "OperationHandler OperationNotes OperationPort PartialObserver RefusalHandler "
        "ServerStats Session SessionRegistry TokenAuthenticator observe_partials "
    ),
    "gateway.observe": (
        "AdminRoutes AdminServer GatewayMetrics GatewaySpan ObservationRecord RecordNotes "
        "RouteUnavailable SpanData SpanEvent Tracer Upstream build_record build_spans "
        "check_tracing configure_logging measure_tracing_cost metrics_route metrics_text "
        "notes_of open_tracer "
        "tracing_problem "
    ),
    "gateway.tools.client": (
        "ClientError ClientOperation ClientSession ConnectionLost DEFAULT_REOPEN MAX_BACKOFF "
        "MAX_ENDED_FRAMES MIN_BACKOFF NnrpClient ResumeTicket TRANSPORT_IDS Trust connect "
        "resubmission "
    ),
    "gateway.tools.cut": (
        "Relayed StreamCutProxy "
    ),
    "gateway.tools.replay": (
        "BACKEND_ERROR_MODEL Disconnect FAMILIES RecordedRequest ReplayServer SERVED_MODELS "
        "Transcript VERSIONS bundled_transcripts choose_scenario conform_body derive "
        "family_transcripts load_transcript parse_transcript record_admission record_all "
        "record_forced "
    ),
    "gateway.tools.conformance": (
        "CA_ANCHOR_REFUSED INCONCLUSIVE ManifestError ValidationReport WILDCARD_HOSTS "
        "break_listener build_plan check_case compile_imported_modules crossing_window_ms "
        "host_route_providers host_route_report host_route_scenarios load_scenario "
        "native_available native_client_options native_openai_submit probe recipes_root "
        "refuses result_status run_host_route run_host_route_case run_plan run_wire_probe "
        "runner_token_submit scenarios_for schema_errors select_host_routes self_signed_ca "
        "suite_capabilities target_manifest validate_results validate_route "
        "validate_wire_case write_atomically "
    ),
}
#: Modules (not packages) re-export what they import; only their own names are public.
_OWN_NAMES_ONLY = frozenset({"gateway.errors", "gateway.tools.cut"})


def public_names(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or name == "annotations":
            continue
        if isinstance(value, types.ModuleType) and name != "events":
            continue
        if module_name in _OWN_NAMES_ONLY and not isinstance(value, int | str) and getattr(
                value, "__module__", module_name) != module_name:
            continue
        names.append(name)
    return sorted(names)


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_public_names_are_pinned(module_name: str) -> None:
    assert public_names(module_name) == sorted(PUBLIC[module_name].split())
