"""The speculators config pieces the parity references build alike (speculators' own classes,
imported when called: the references run with .venv/trainer-oracles on their path)."""
from __future__ import annotations


def greedy_speculators_config(algorithm: str, drafts: int, architectures: list[str]):
    """speculators' SpeculatorsConfig of `algorithm`: a greedy proposal of `drafts` tokens for a
    verifier of `architectures` (no checkpoint named)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    return SpeculatorsConfig(
        algorithm=algorithm, default_proposal_method="greedy",
        proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=drafts)],
        verifier=VerifierConfig(name_or_path=None, architectures=list(architectures)))


def eagle_speculator_kwargs(v: dict, algorithm: str, drafts: int, verifier: str) -> dict:
    """The keys an EAGLE-3-style speculators config (EAGLE-3's, P-EAGLE's) takes beyond the layer
    config, draft vocabulary and aux layers: the variant's norm switches and a greedy proposal
    of `drafts` tokens for a `verifier` architecture."""
    return dict(
        norm_before_fc=v.get("norm_before_fc", False), fc_norm=v.get("fc_norm", False),
        norm_before_residual=v.get("norm_before_residual", False),
        norm_output=v.get("norm_output", False),
        speculators_config=greedy_speculators_config(algorithm, drafts, [verifier]))
