"""The call pipeline: every collective call takes the same path on every rank.

    describe  -> the call's record: its sequence number, collective and call site
    validate  -> this rank's checks, as a Verdict (what it refuses, and whether the fault
                 is in what it contributes or in where it receives); nothing raised yet
    agree     -> what the ranks must share before any data moves: check mode's
                 fingerprint (with every rank's verdict), a root's header, the counts
    choose    -> the algorithm, from agreed values only
    run       -> the algorithm (or the library's collective) over the backend's transport
    deliver   -> the result in the caller's kind of array; a refusal this rank took part
                 with is raised now

Agreement by construction: every decision that shapes messages is made from values all
ranks hold identically (the call's arguments, by the shape contract) or agreed in the
call's first exchange. A refusal only one rank can see either travels in a message the
call sends anyway (a root's header, the v-variants' counts), or that rank takes part with
workspace and raises afterwards (its ``out=``), or, where it would have to send made-up
data, raises at once; its next call then first checks with the others that they refused
that call too (``agree.resync``), so no call ever matches another's messages.
"""
