-- KEYS[1]: a requests-per-minute check's GCRA state (the TAT that admit.lua's 'rate' check reads and sets).
-- ARGV: interval_us, tokens wanted, burst (after prelude.lua: now_us).
-- Grants up to the tokens wanted, each advancing the TAT by one interval, while the exact check would admit each
-- (the TAT stays within burst intervals of now): Redis never hands out more than the limit's burst and rate,
-- whichever replicas lease and whatever the others take exactly.
-- Returns {granted, 0}, or {0, wait_us} (until the exact check would admit one) when not one token fits.
local now = now_us()
local interval, wanted, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), math.max(tonumber(ARGV[3]), 1)
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local room = math.floor((now + burst * interval - tat) / interval)
if room < 1 then return {0, tat - (burst - 1) * interval - now} end
local granted = math.min(wanted, room)
local ends = tat + granted * interval
redis.call('SET', KEYS[1], string.format('%d', ends), 'PX', math.ceil((ends - now) / 1000) + 1000)
return {granted, 0}
