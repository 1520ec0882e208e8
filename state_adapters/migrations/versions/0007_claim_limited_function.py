"""Postgres: ``{prefix}claim_limited``, the claim of a limited job type as one
statement (state_adapters/steps/limited_claims.py has the invariants; SQLite gets nothing).

Called in autocommit, it is one round trip. It is a VOLATILE PL/pgSQL function, so
each statement in it runs on a snapshot of its own ("VOLATILE functions obtain a
fresh snapshot at the start of each query they execute", PostgreSQL's "Function
Volatility Categories"): the running jobs are counted after the type's control row
is locked, and so include every claim committed while this one waited for the lock.
Under REPEATABLE READ or SERIALIZABLE the lock would raise a serialization failure
instead (never a claim beyond the limits); the queue's connections run READ
COMMITTED, the server's default.

Its result lists the job columns one by one (no dependency on the jobs table's row
type, so dropping the tables needs no CASCADE): a migration that adds a job column
the queue reads replaces the function.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

from state_adapters.schema import Tables

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_BODY = """
CREATE FUNCTION {fn}(
    p_type varchar, p_worker varchar, p_leased_until timestamptz, p_limit integer,
    p_now timestamptz, p_max_keys integer, p_unkeyed_window integer, p_rate_steps integer
) RETURNS TABLE (
    outcome jsonb,
    id varchar, type_name varchar, chain_id varchar, chain_index integer, input jsonb,
    output jsonb, status varchar, priority integer, created_at timestamptz,
    scheduled_at timestamptz, completed_at timestamptz, attempt integer,
    max_attempts integer, last_error text, leased_by varchar, lease_token varchar,
    leased_until timestamptz, deduplication_key varchar, progress jsonb,
    trace_context text, concurrency_key varchar
) LANGUAGE plpgsql VOLATILE
-- Generic plans, made once per session: the statements' shapes never change, and
-- with custom plans Postgres planned each of them again on every call (0.25 ms of
-- the 0.45 ms a call took on a quiet machine).
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    c record;
    r record;
    v_control varchar;
    v_now timestamptz := p_now;
    v_until timestamptz := p_leased_until;
    v_locked timestamptz;
    v_running jsonb := '{{}}';
    v_total integer := 0;
    v_budget integer := 0;
    v_rate_bound boolean := false;
    v_window boolean := false;
    v_step float8;
    v_at float8;
    v_step_at float8;
    v_step_starts integer;
    v_earlier integer;
    v_folded boolean := false;
    v_starts jsonb;
    v_expired integer;
    v_cut float8;
    v_allowance integer;
    v_frees_at timestamptz;
    v_ids varchar[] := '{{}}';
    v_picked integer;
    v_after varchar;
    v_save boolean := false;
    v_order varchar[] := '{{}}';
    v_free integer[] := '{{}}';
    v_unkeyed_at integer;
    v_visited integer := 0;
    v_eligible integer := 0;
    v_from varchar;
    v_to varchar;
    v_f integer;
    v_unkeyed_free integer;
    v_last integer;
BEGIN
    -- As the plain claim's: a claim lost with the server is redone.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO c FROM {controls} AS tc WHERE tc.type_name = p_type FOR UPDATE;
    IF NOT FOUND THEN
        v_control := 'uncontrolled';
    ELSIF c.paused THEN
        v_control := 'paused';
    ELSIF c.concurrency IS NULL AND c.key_concurrency IS NULL AND c.rate IS NULL THEN
        v_control := 'uncontrolled';
    ELSE
        v_control := 'limited';
    END IF;

    IF v_control = 'limited' THEN
        -- The claim's instant is taken once the lock is held: the claims of one type
        -- are then in the order of their instants (the rate's window needs that).
        v_locked := clock_timestamp();
        IF v_locked > v_now THEN
            v_until := v_until + (v_locked - v_now);
            v_now := v_locked;
        END IF;
        -- A statement of its own: a new snapshot, taken after the lock.
        IF c.key_concurrency IS NOT NULL THEN
            SELECT coalesce(jsonb_object_agg(coalesce(g.key, ''), g.n), '{{}}'),
                   coalesce(sum(g.n), 0)
              INTO v_running, v_total
              FROM (SELECT j.concurrency_key AS key, count(*) AS n FROM {jobs} AS j
                    WHERE j.status = 'running' AND j.type_name = p_type GROUP BY 1) AS g;
        ELSIF c.concurrency IS NOT NULL THEN
            SELECT count(*) INTO v_total FROM {jobs} AS j
             WHERE j.status = 'running' AND j.type_name = p_type;
        END IF;
        v_budget := p_limit;
        IF c.concurrency IS NOT NULL THEN
            v_budget := least(v_budget, c.concurrency - v_total);
        END IF;
        v_starts := c.recent_starts;
        v_earlier := c.earlier_starts;
        v_step_at := c.step_at;
        v_step_starts := c.step_starts;
        IF c.rate IS NOT NULL AND c.per_seconds IS NOT NULL THEN
            -- The window as state_adapters.steps.limited_claims.RateWindow keeps it: within the
            -- newest step a claim reads and adds to numbers only; the first claim of a
            -- later step folds that step into the earlier ones, whose expired entries
            -- lead (instants never decrease), so they are counted from the front and
            -- sliced off. A claimer whose clock is behind counts as in the newest step.
            v_window := true;
            v_step := c.per_seconds / p_rate_steps;
            v_at := ceil(extract(epoch FROM v_now) / v_step) * v_step;
            v_folded := v_step_at IS NULL OR v_at > v_step_at;
            IF v_folded THEN
                -- A row limited before it had a rate may hold JSON null (0005's writes).
                IF jsonb_typeof(v_starts) IS DISTINCT FROM 'array' THEN
                    v_starts := '[]';
                END IF;
                IF v_step_starts > 0 THEN
                    v_starts := v_starts || jsonb_build_array(
                        jsonb_build_array(v_step_at, v_step_starts));
                END IF;
                v_cut := v_at - v_step - c.per_seconds;
                v_expired := 0;
                -- Past the last entry the element is NULL, which ends the loop.
                WHILE (v_starts -> v_expired ->> 0)::float8 <= v_cut LOOP
                    v_expired := v_expired + 1;
                END LOOP;
                IF v_expired > 0 THEN
                    v_starts := jsonb_path_query_array(
                        v_starts, '$[$k to last]', jsonb_build_object('k', v_expired));
                END IF;
                SELECT coalesce(sum((e.v ->> 1)::numeric), 0) INTO v_earlier
                  FROM jsonb_array_elements(v_starts) AS e(v);
                v_step_at := v_at;
                v_step_starts := 0;
            END IF;
            v_allowance := greatest(0, c.rate - v_earlier - v_step_starts);
            v_rate_bound := v_allowance < v_budget;
            v_budget := least(v_budget, v_allowance);
            IF v_rate_bound THEN
                v_frees_at := to_timestamp(
                    coalesce((v_starts -> 0 ->> 0)::float8, v_step_at) + c.per_seconds);
            END IF;
        END IF;
        v_after := c.next_key_after;

        IF v_budget > 0 AND c.key_concurrency IS NULL THEN
            -- A plain claim that read the type before it was limited may hold a row.
            SELECT coalesce(array_agg(b.id), '{{}}') INTO v_ids
              FROM (SELECT j.id FROM {jobs} AS j
                     WHERE j.status = 'pending' AND j.type_name = p_type
                       AND j.scheduled_at <= v_now
                     ORDER BY j.priority, j.scheduled_at, j.id
                     LIMIT v_budget FOR NO KEY UPDATE SKIP LOCKED) AS b;
        ELSIF v_budget > 0 THEN
            -- The key walk: the keys with pending jobs in key order, from the one after
            -- the key served last round to the end, then (the jobs without a key, then)
            -- from the start up to that key; one index probe per key, lazily, until
            -- enough keys can give a job or p_max_keys were visited.
            v_from := coalesce(c.next_key_after, '');
            v_unkeyed_free := greatest(
                0, c.key_concurrency - coalesce((v_running ->> '')::integer, 0));
            IF c.next_key_after IS NULL THEN
                v_order := v_order || NULL::varchar;
                v_free := v_free || v_unkeyed_free;
                v_unkeyed_at := 1;
            END IF;
            LOOP
                FOR r IN
                    WITH RECURSIVE walk(key, n) AS (
                        SELECT (SELECT j.concurrency_key FROM {jobs} AS j
                                 WHERE j.status = 'pending' AND j.type_name = p_type
                                   AND j.concurrency_key > v_from
                                 ORDER BY j.concurrency_key LIMIT 1), 1
                        UNION ALL
                        SELECT (SELECT j.concurrency_key FROM {jobs} AS j
                                 WHERE j.status = 'pending' AND j.type_name = p_type
                                   AND j.concurrency_key > w.key
                                 ORDER BY j.concurrency_key LIMIT 1), w.n + 1
                          FROM walk AS w
                         WHERE w.key IS NOT NULL AND w.n < p_max_keys - v_visited
                           AND (v_to IS NULL OR w.key < v_to)
                    )
                    SELECT w.key,
                           EXISTS (SELECT FROM {jobs} AS j
                                    WHERE j.status = 'pending' AND j.type_name = p_type
                                      AND j.concurrency_key = w.key
                                      AND j.scheduled_at <= v_now) AS due
                      FROM walk AS w
                     WHERE w.key IS NOT NULL AND (v_to IS NULL OR w.key <= v_to)
                LOOP
                    v_visited := v_visited + 1;
                    v_f := greatest(
                        0, c.key_concurrency - coalesce((v_running ->> r.key)::integer, 0));
                    v_order := v_order || r.key;
                    v_free := v_free || CASE WHEN r.due THEN v_f ELSE 0 END;
                    IF r.due AND v_f > 0 THEN
                        v_eligible := v_eligible + 1;
                    END IF;
                    EXIT WHEN v_eligible >= v_budget;
                END LOOP;
                EXIT WHEN v_eligible >= v_budget OR v_visited >= p_max_keys
                    OR v_to IS NOT NULL OR c.next_key_after IS NULL;
                -- Wrap around: the jobs without a key, then the keys up to the last served.
                v_order := v_order || NULL::varchar;
                v_free := v_free || v_unkeyed_free;
                v_unkeyed_at := coalesce(array_length(v_order, 1), 0);
                v_from := '';
                v_to := c.next_key_after;
            END LOOP;
            -- Round robin: each visited key's best due job in visit order, then each
            -- one's second best while below its cap, and so on, up to the budget.
            SELECT coalesce(array_agg(p.id ORDER BY p.round, p.pos), '{{}}'), count(*),
                   (array_agg(p.pos ORDER BY p.round DESC, p.pos DESC))[1]
              INTO v_ids, v_picked, v_last
              FROM (SELECT q.id, q.round, q.pos FROM (
                        SELECT v.pos, h.id, h.round
                          FROM unnest(v_order, v_free) WITH ORDINALITY AS v(key, free, pos)
                          CROSS JOIN LATERAL (
                              SELECT j.id, row_number() OVER (
                                         ORDER BY j.priority, j.scheduled_at, j.id) AS round
                                FROM {jobs} AS j
                               WHERE j.status = 'pending' AND j.type_name = p_type
                                 AND j.concurrency_key = v.key AND j.scheduled_at <= v_now
                               ORDER BY j.priority, j.scheduled_at, j.id
                               LIMIT v.free) AS h
                         WHERE v.key IS NOT NULL AND v.free > 0
                        UNION ALL
                        SELECT v_unkeyed_at, u.id, row_number() OVER (
                                   ORDER BY u.priority, u.scheduled_at, u.id)
                          FROM (SELECT b.id, b.priority, b.scheduled_at
                                  FROM (SELECT j.id, j.concurrency_key, j.priority, j.scheduled_at
                                          FROM {jobs} AS j
                                         WHERE j.status = 'pending' AND j.type_name = p_type
                                           AND j.scheduled_at <= v_now
                                         ORDER BY j.priority, j.scheduled_at, j.id
                                         LIMIT p_unkeyed_window) AS b
                                 WHERE b.concurrency_key IS NULL
                                 ORDER BY b.priority, b.scheduled_at, b.id
                                 LIMIT coalesce(v_free[v_unkeyed_at], 0)) AS u
                         WHERE v_unkeyed_at IS NOT NULL
                    ) AS q
                    ORDER BY q.round, q.pos
                    LIMIT v_budget) AS p;
            -- The next claim starts after the key served last, or, when slots remain
            -- (every visited key had its turn), after the last key visited.
            IF v_picked >= v_budget THEN
                v_after := coalesce(v_order[v_last], '');
            ELSIF coalesce(array_length(v_order, 1), 0) > 0 THEN
                v_after := coalesce(v_order[array_length(v_order, 1)], '');
            END IF;
        END IF;
        v_save := v_folded OR v_after IS DISTINCT FROM c.next_key_after;
    END IF;

    RETURN QUERY
    WITH claimed AS (
        UPDATE {jobs} AS j
           SET status = 'running', attempt = j.attempt + 1, leased_by = p_worker,
               lease_token = replace(gen_random_uuid()::text, '-', ''),
               leased_until = v_until
         -- By primary key; rechecked, as a cancel or a stale plain claim may have won.
         WHERE j.id = ANY (v_ids) AND (j.status || '') = 'pending'
        RETURNING j.*
    ), saved AS (
        UPDATE {controls} AS tc
           SET recent_starts = CASE WHEN v_folded THEN v_starts ELSE tc.recent_starts END,
               earlier_starts = v_earlier,
               step_at = v_step_at,
               step_starts = CASE WHEN v_window
                   THEN v_step_starts + (SELECT count(*) FROM claimed)
                   ELSE tc.step_starts END,
               next_key_after = v_after
         WHERE tc.type_name = p_type
           AND (v_save OR (v_window AND EXISTS (SELECT FROM claimed)))
    )
    -- The outcome once, on one row: every further column costs the caller's driver
    -- and SQLAlchemy work per call, and each value per row.
    SELECT CASE WHEN row_number() OVER () = 1 THEN jsonb_build_object(
               'control', v_control, 'budget', v_budget, 'rate_bound', v_rate_bound,
               'frees_at', extract(epoch FROM v_frees_at), 'picked', v_picked,
               'claimed_at', extract(epoch FROM v_now)) END,
           k.id, k.type_name, k.chain_id, k.chain_index, k.input, k.output, k.status,
           k.priority, k.created_at, k.scheduled_at, k.completed_at, k.attempt,
           k.max_attempts, k.last_error, k.leased_by, k.lease_token, k.leased_until,
           k.deduplication_key, k.progress, k.trace_context, k.concurrency_key
      FROM (SELECT) AS one LEFT JOIN claimed AS k ON true;
END
$fn$
"""


def _names(tables: Tables) -> dict[str, str]:
    quote = op.get_bind().dialect.identifier_preparer
    schema = "" if tables.schema is None else quote.quote_schema(tables.schema) + "."
    p = tables.table_prefix
    return {
        "fn": schema + quote.quote(f"{p}claim_limited"),
        "jobs": schema + quote.quote(f"{p}jobs"),
        "controls": schema + quote.quote(f"{p}type_controls"),
    }


def upgrade(tables: Tables) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_BODY.format(**_names(tables)))


def downgrade(tables: Tables) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION {fn}".format(**_names(tables)))
